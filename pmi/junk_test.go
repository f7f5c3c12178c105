package pmi

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// socketPair returns the two ends of a Unix stream socket pair, as the
// launcher gives a rank its PMI_FD.
func socketPair(t *testing.T) (rank, server net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ends [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pmi")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		ends[i] = c
	}
	return ends[0], ends[1]
}

// A rank that writes junk to PMI_FD gets one reply that says the request
// was malformed and then its connection closed, at once: junk lines,
// PMI-2 frames with junk, and a request that never ends (no newline) alike.
// The server's error names the rank. Nothing waits for an outer timeout.
func TestJunkClosesConnection(t *testing.T) {
	cases := []struct {
		name  string
		send  []string
		reply string // what the last reply must contain
	}{
		{"binary line", []string{"\x00\x01\xfe not PMI at all\n"}, "malformed"},
		{"junk after init", []string{"cmd=init pmi_version=1 pmi_subversion=1\n", "hello there\n"}, "malformed"},
		{"line without end", []string{"cmd=init pmi_version=1 pmi_subversion=1\n", "cmd=barrier_in junk junk"}, "unfinished"},
		{"PMI-2 junk frame", []string{"cmd=init pmi_version=2 pmi_subversion=0\n", "zzzzzzzzzzzz"}, "length"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewServer(Config{KVSName: "k", Size: 2, Ranks: []int{0, 1}, RequestTimeout: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			rank, server := socketPair(t)
			defer rank.Close()
			var wg sync.WaitGroup
			var serveErr error
			wg.Go(func() { serveErr = s.ServeConn(1, server) })
			br := bufio.NewReader(rank)
			var last string
			_ = rank.SetReadDeadline(time.Now().Add(5 * time.Second))
			for _, m := range tc.send {
				if _, err := io.WriteString(rank, m); err != nil {
					t.Fatal(err)
				}
				b, err := br.ReadBytes('\n')
				if len(b) == 0 && strings.HasPrefix(tc.send[0], "cmd=init pmi_version=2") && m != tc.send[0] {
					// PMI-2 replies are framed, not lines: read what came.
					b, err = io.ReadAll(br)
				}
				if err != nil && !errors.Is(err, io.EOF) {
					t.Fatalf("after %q: %v (the server neither answered nor closed)", m, err)
				}
				last = string(b)
			}
			if !strings.Contains(last, "rc=-1") || !strings.Contains(last, tc.reply) {
				t.Errorf("reply to junk: %q, want rc=-1 and %q", last, tc.reply)
			}
			// Then the connection is closed: EOF, not a wait.
			if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
				t.Errorf("after the error reply: %v, want the connection closed (EOF)", err)
			}
			waitOrFail(t, &wg)
			if serveErr == nil || !strings.Contains(serveErr.Error(), "rank 1") {
				t.Errorf("ServeConn: %v, want an error naming rank 1", serveErr)
			}
		})
	}
}
