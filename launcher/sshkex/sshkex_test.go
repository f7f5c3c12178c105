package sshkex

import (
	"reflect"
	"testing"
)

func TestFastKex(t *testing.T) {
	for _, tc := range []struct {
		out          string
		major, minor int
		ok           bool
	}{
		{"OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 27 Jan 2026", 9, 2, true},
		{"OpenSSH_10.0p2, OpenSSL 3.5.0", 10, 0, true},
		{"OpenSSH_8.0p1, OpenSSL 1.1.1k  FIPS 25 Mar 2021", 8, 0, true},
		{"Dropbear v2022.83", 0, 0, false},
		{"", 0, 0, false},
	} {
		major, minor, ok := parseOpenSSHVersion(tc.out)
		if major != tc.major || minor != tc.minor || ok != tc.ok {
			t.Errorf("parseOpenSSHVersion(%q) = %d, %d, %v; want %d, %d, %v", tc.out, major, minor, ok, tc.major, tc.minor, tc.ok)
		}
	}
	ssh := []string{"/usr/bin/ssh", "-F", "cfg", "n1", "gorun", "agent"}
	want := append([]string{"/usr/bin/ssh", "-o", Option}, ssh[1:]...)
	if got := fastKexFor(ssh, 9, 2); !reflect.DeepEqual(got, want) {
		t.Errorf("OpenSSH 9.2: %q, want %q", got, want)
	}
	if got := fastKexFor(ssh, 10, 1); !reflect.DeepEqual(got, want) {
		t.Errorf("OpenSSH 10.1: %q, want %q", got, want)
	}
	// Clients before 9.0 already default to curve25519 (and 8.6 and older
	// reject the '^' syntax); unknown clients and other commands are left
	// alone, and so is a template that picks its own key exchange.
	for _, tc := range []struct {
		argv         []string
		major, minor int
	}{
		{ssh, 8, 9},
		{ssh, 0, 0},
		{[]string{"ip", "netns", "exec", "n1", "gorun"}, 9, 2},
		{[]string{"ssh", "-o", "KexAlgorithms=diffie-hellman-group14-sha256", "n1"}, 9, 2},
		{nil, 9, 2},
	} {
		if got := fastKexFor(tc.argv, tc.major, tc.minor); !reflect.DeepEqual(got, tc.argv) {
			t.Errorf("fastKexFor(%q, %d.%d) = %q, want it unchanged", tc.argv, tc.major, tc.minor, got)
		}
	}
}
