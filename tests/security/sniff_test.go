package security

import (
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// sniffer captures every frame on one interface (AF_PACKET, as root), to
// check what crosses the network in clear.
type sniffer struct {
	fd   int
	mu   sync.Mutex
	pkts [][]byte
	wg   sync.WaitGroup
	stop chan struct{}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func sniff(t *testing.T, iface string) *sniffer {
	t.Helper()
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, int(htons(syscall.ETH_P_ALL)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrLinklayer{Protocol: htons(syscall.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	tv := syscall.NsecToTimeval(int64(100 * time.Millisecond))
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	s := &sniffer{fd: fd, stop: make(chan struct{})}
	s.wg.Go(func() {
		buf := make([]byte, 1<<16)
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			n, _, err := syscall.Recvfrom(fd, buf, 0)
			if err != nil || n <= 0 {
				continue
			}
			s.mu.Lock()
			s.pkts = append(s.pkts, append([]byte(nil), buf[:n]...))
			s.mu.Unlock()
		}
	})
	t.Cleanup(s.close)
	return s
}

func (s *sniffer) close() {
	select {
	case <-s.stop:
		return
	default:
	}
	close(s.stop)
	s.wg.Wait()
	syscall.Close(s.fd)
}

// contains reports whether any captured frame holds a quarter of secret
// (hex): a secret split across frames leaves at least half of it in one,
// and so at least one aligned quarter.
func (s *sniffer) contains(secret string) (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := len(secret) / 4
	for _, p := range s.pkts {
		for i := 0; i+q <= len(secret); i += q {
			if strings.Contains(string(p), secret[i:i+q]) {
				return true, len(s.pkts)
			}
		}
	}
	return false, len(s.pkts)
}
