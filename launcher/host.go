package launcher

import "github.com/gorun-hpc/gorun/launcher/hostfile"

// Host is one entry of a host list (hostfile.Host): a machine name and how
// many ranks it takes. The host list has its own package, which parses
// hostfiles and -H values; the name stays here, as os.FileMode stays
// beside io/fs, because every plan and job speaks of hosts.
type Host = hostfile.Host
