// Package sshkex owns the key exchange of gorun's ssh connections: the
// option a starter adds to an ssh command line (Fast), both where gorun
// starts host agents (package launcher's starters) and where a host agent
// starts further agents in a two-level tree (launcher/hostagent).
//
// OpenSSH 9.0 made the post-quantum hybrid sntrup761x25519-sha512 its
// default key exchange. It costs the two ends about a quarter of a second
// of CPU per connection (measured on the test hosts: `ssh host true` takes
// 0.53 s with it and 0.29 s with curve25519-sha256), and a job launch opens
// one connection per host, several at a time. The hybrid protects a
// session's contents against a future quantum computer ("harvest now,
// decrypt later"). gorun's connection carries the agent's command line and
// the per-job secret on stdin, both worthless once the job has ended; the
// job's own traffic never crosses it. So gorun puts curve25519-sha256 (the
// default before 9.0) first in the list, keeping OpenSSH's own list behind
// it for servers without it. `--ssh-kex default`
// leaves ssh's configuration alone (launcher.Config.SSHDefaultKex;
// wire.ChildLaunch.FastKex carries the choice to a tree parent, whose
// own ssh client's version decides).
package sshkex
