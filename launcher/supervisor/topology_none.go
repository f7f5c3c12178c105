//go:build !linux || nogpu

package supervisor

import "errors"

// exportTopologyXML is not built into this gorun: the nogpu build is fully
// static and cannot load libhwloc at run time, so ranks discover the
// topology themselves, as without gorun.
func exportTopologyXML() ([]byte, error) {
	return nil, errors.New("this gorun is built without run-time library loading (nogpu); ranks discover the topology themselves")
}
