package main

import "github.com/gorun-hpc/gorun/launcher"

// readHosts turns -H or -hostfile into a host list; nil means "this
// machine, one slot per rank".
func readHosts(o options) ([]launcher.Host, error) {
	switch {
	case o.hostfile != "":
		return launcher.ParseHostfile(o.hostfile)
	case o.hostList != "":
		return launcher.ParseHostList(o.hostList)
	}
	return nil, nil
}
