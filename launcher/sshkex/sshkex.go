package sshkex

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Option is the ssh option that prepends curve25519 to the default
// list; the '^' syntax exists since OpenSSH 8.7.
const Option = "KexAlgorithms=^curve25519-sha256,curve25519-sha256@libssh.org"

var sshVersion struct {
	once         sync.Once
	major, minor int // 0, 0 when unknown
}

var opensshVersionRE = regexp.MustCompile(`OpenSSH_(\d+)\.(\d+)`)

// parseOpenSSHVersion reads `ssh -V`'s output; ok is false for anything
// that is not OpenSSH.
func parseOpenSSHVersion(out string) (major, minor int, ok bool) {
	m := opensshVersionRE.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, false
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return major, minor, true
}

// localSSHVersion asks the ssh client on this host for its version, once
// per process (a few milliseconds).
func localSSHVersion(ssh string) (major, minor int) {
	sshVersion.once.Do(func() {
		out, _ := exec.Command(ssh, "-V").CombinedOutput()
		sshVersion.major, sshVersion.minor, _ = parseOpenSSHVersion(string(out))
	})
	return sshVersion.major, sshVersion.minor
}

// needsFastKex reports whether an OpenSSH client of this version defaults
// to the hybrid exchange and understands the '^' list syntax.
func needsFastKex(major, minor int) bool {
	_ = minor
	return major >= 9
}

// Fast returns argv with Option added after the program when argv runs an
// OpenSSH client (on this host) that defaults to the hybrid exchange and
// does not choose a key exchange itself; any other argv is returned as it
// is. The first call runs `ssh -V` once for the process; safe for
// concurrent use.
func Fast(argv []string) []string {
	if len(argv) == 0 || filepath.Base(argv[0]) != "ssh" {
		return argv
	}
	major, minor := localSSHVersion(argv[0])
	return fastKexFor(argv, major, minor)
}

// fastKexFor is Fast for an ssh client of the given version.
func fastKexFor(argv []string, major, minor int) []string {
	if len(argv) == 0 || filepath.Base(argv[0]) != "ssh" || !needsFastKex(major, minor) {
		return argv
	}
	for _, a := range argv[1:] {
		if strings.Contains(strings.ToLower(a), "kexalgorithms") {
			return argv // the user chose; an earlier -o would override them
		}
	}
	out := make([]string, 0, len(argv)+2)
	out = append(out, argv[0], "-o", Option)
	return append(out, argv[1:]...)
}
