//go:build !linux

package comm

// quietSysmon is Linux only (sysmon_linux.go).
func quietSysmon() {}

func unbatch() {}
