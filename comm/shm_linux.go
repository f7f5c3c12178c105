package comm

import (
	"bufio"
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorun-hpc/gorun/internal/owner"
)

// Shared memory between two ranks on one host: a segment in /dev/shm with
// one single-producer single-consumer byte ring per direction. The dialer
// creates the segment and names it in its hello; the acceptor maps it and
// acknowledges; the dialer then unlinks it. From then on the segment has no
// name, so a crash of either process, at any point, leaves nothing behind.
//
// The TCP connection that carried the handshake stays open as the liveness
// channel: a peer that dies closes it, and a goroutine blocked reading it
// marks the link dead and wakes any waiter.
//
// Layout: a 4 KiB control page (per direction: head and tail counters and
// two futex words, each on its own cache line), then the fast slots of
// direction 0 (dialer → acceptor) and of direction 1, then ring 0, then
// ring 1. head and tail are byte counts that only grow; they move in
// multiples of 8 (frames are padded to 8 bytes) so every frame and every
// piece handed to a reduction is aligned for any element type.
//
// Fast slots are the latency path, as in the fast boxes of Open MPI's
// shared-memory transport and NCCL's LL protocol: a data frame that is a
// whole message of at most fastMaxPayload bytes goes into the next of
// fastSlots fixed slots, header and payload together, and becomes visible
// by one store of its flag word in the slot's first cache line. A message
// of 8 bytes is one cache line: the receiver polls the line that carries
// the data, instead of a head counter on one line and the frame on others,
// and the sender touches no counter the receiver polls. The flag is the
// message's number in the direction plus one, so a slot's stale contents
// never match the flag the receiver waits for; the receiver hands slots
// back through a consumed counter the sender reads only when it has gone
// round all the slots since it last looked.
//
// Frames of one direction are numbered across both paths (ring frames
// carry the low 32 bits of their number in header bytes 12-15, which the
// wire header leaves zero), so the receiver delivers them in the order
// they were sent: a ring frame whose number is not the next one means the
// next one is in a fast slot, where the sender put it first.

const (
	shmCtlBytes = 4096
	shmPrefix   = "gorun-"
	cacheLine   = 64
	// Per direction, in the control page: head, tail, consumer-waiting,
	// producer-waiting, each on its own line.
	dirCtlBytes = 4 * cacheLine
	// Per side (0 dialer, 1 acceptor), at cpuCtlOff + side·cacheLine: the
	// CPU (plus one; 0 unknown) its waiting thread last ran on; at
	// sidCtlOff + side·cacheLine its session id (getsid), written when
	// the side maps the segment, before its handshake message.
	cpuCtlOff = 1024
	sidCtlOff = cpuCtlOff + 8
	// shmFrameSkip marks a header-sized record after which the consumer
	// skips to the ring's beginning. Never seen outside the link.
	shmFrameSkip = 0xff
	// Per direction, at fastCtlOff + dir·cacheLine: how many fast slots
	// the receiver has read (and so handed back).
	fastCtlOff = 2048

	// fastSlots slots of fastSlotBytes per direction: a 40-byte header
	// (flag, the frame's call fields, payload length; the layout is at
	// sendFast) and up to fastMaxPayload bytes, so that
	// 4 KiB, a whole power-of-two message, still fits. 16 slots: far more
	// than the two unread frames EagerLimit promises, so a sender finds a
	// free slot without reading the receiver's counter for 16 messages.
	fastSlots      = 16
	fastHdrBytes   = 40
	fastSlotBytes  = cacheLine + 4096
	fastMaxPayload = fastSlotBytes - fastHdrBytes
	shmFastBytes   = fastSlots * fastSlotBytes
)

// shmSize is the size of a segment with rings of ringBytes.
func shmSize(ringBytes int) int { return shmCtlBytes + 2*shmFastBytes + 2*ringBytes }

// fastLimit is the largest payload the sender puts in a fast slot (at most
// fastMaxPayload; a variable only so that benchmarks can compare the two
// paths, see SetFastLimit). The receiver takes frames from both paths
// whatever the sender's limit.
var fastLimit atomic.Int64

func init() { fastLimit.Store(fastMaxPayload) }

type shmSegment struct {
	path      string
	name      string
	mem       []byte
	ringBytes int
	unlinked  atomic.Bool
}

func createShm(dir string, gid GroupID, me, peer, ringBytes int) (*shmSegment, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	name := fmt.Sprintf("%s%d.%d-%016x-%d-%d-%s", shmPrefix, os.Getpid(), owner.PIDNamespace(), uint64(gid), me, peer, hex.EncodeToString(rnd[:]))
	path := filepath.Join(dir, name)
	size := shmSize(ringBytes)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("comm: creating %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Unlink(path)
		return nil, fmt.Errorf("comm: sizing %s: %w", path, err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Unlink(path)
		return nil, fmt.Errorf("comm: mapping %s: %w", path, err)
	}
	seg := &shmSegment{path: path, name: name, mem: mem, ringBytes: ringBytes}
	seg.prefault()
	seg.publishSession(0)
	return seg, nil
}

// prefaultRing is how much of each ring prefault maps: the part light
// traffic keeps reusing (a skip to the beginning comes after wrapFrom,
// about a sixteenth of the ring), with room to spare.
func prefaultRing(ringBytes int) int { return min(ringBytes, ringBytes/8+64<<10) }

// prefault maps this process's pages of the control page, the fast slots
// and the start of each ring now (allocating them in the segment if the
// peer has not), rather than at the first message that touches each: a
// sweep's first 16 small calls each took 3-80 µs instead of 0.5 µs, one
// page fault per fast slot on each side (2 ranks, 8-byte all-reduce,
// 2-core VM): the first size of a sweep needed ~50 warm-up calls. An
// older kernel without MADV_POPULATE_WRITE leaves the faults to first use.
func (s *shmSegment) prefault() {
	head := shmCtlBytes + 2*shmFastBytes
	_ = unix.Madvise(s.mem[:head], unix.MADV_POPULATE_WRITE)
	for dir := range 2 {
		o := head + dir*s.ringBytes
		_ = unix.Madvise(s.mem[o:o+prefaultRing(s.ringBytes)], unix.MADV_POPULATE_WRITE)
	}
}

// publishSession writes this process's scheduling-group tag into side's
// line of the control page (see sidCtlOff).
func (s *shmSegment) publishSession(side int) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.mem[sidCtlOff+side*cacheLine])), schedGroup())
}

// schedGroup is this process's tag, read once.
var schedGroup = sync.OnceValue(func() uint32 {
	enabled, _ := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled")
	group, _ := os.ReadFile("/proc/self/autogroup")
	sid, _ := unix.Getsid(0)
	return schedGroupTag(string(enabled), string(group), ownCPUCgroup(), sid)
})

// schedGroupTag names the CFS group whose threads share a core's time,
// which is what decides whether yielding to a peer helps it (0: unknown).
// Below the root of the cpu controller's hierarchy (cpuCgroup, see
// cpuCgroupOf: a container, a systemd slice with cpu accounting, a job's
// scheduling group) that is the cgroup, whatever the session, tagged by a
// hash of its path (cgroupTag). At the root, with autogroup on, it is the
// session's autogroup ("/autogroup-N nice 0" in /proc/self/autogroup),
// tagged N+1 so the root group is not 0; with it off, every process shares
// one group (tag 1). Without the proc files, the session id stands in for
// the autogroup; it is 0 when the session leader lives outside this PID
// namespace (a container entered with exec), which is why the autogroup
// comes first.
func schedGroupTag(enabled, autogroup, cpuCgroup string, sid int) uint32 {
	if cpuCgroup != "" {
		return cgroupTag(cpuCgroup)
	}
	if strings.TrimSpace(enabled) == "0" {
		return 1
	}
	if rest, ok := strings.CutPrefix(autogroup, "/autogroup-"); ok {
		num, _, _ := strings.Cut(rest, " ")
		if n, err := strconv.ParseUint(num, 10, 31); err == nil {
			return uint32(n) + 1
		}
	}
	if sid > 0 {
		return uint32(sid) | 1<<31
	}
	return 0
}

// session is the session id side published (0: none).
func (s *shmSegment) session(side int) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&s.mem[sidCtlOff+side*cacheLine])))
}

// SweepShm removes the shared-memory segments left in dir by processes
// that no longer exist and reports how many; gorun's supervisor runs it
// once every rank of a job is gone, so a rank killed mid-handshake leaves
// nothing behind.
func SweepShm(dir string) int { return sweepShm(dir) }

// sweepShm removes segments left in dir by processes that no longer exist.
// A segment has a name only between its creation and the end of the
// handshake; a dialer that crashed in that window leaves one behind, and the
// next endpoint on the host cleans it up. The creator's pid is in the name.
func sweepShm(dir string) int {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	removed := 0
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, shmPrefix) {
			continue
		}
		pid, ns, ok := shmOwner(name[len(shmPrefix):])
		// A name without a namespace (made before it was recorded) is
		// judged as this namespace's; one of another is not ours to judge.
		if ok && owner.Gone(pid, cmp.Or(ns, owner.PIDNamespace())) {
			if unix.Unlink(filepath.Join(dir, name)) == nil {
				removed++
			}
		}
	}
	return removed
}

// shmOwner reads the creator's pid and PID namespace (0: not recorded)
// from a segment's name after the prefix: "PID.NS-…", or "PID-…" as
// segments made before the namespace was recorded are named.
func shmOwner(rest string) (pid int, ns uint64, ok bool) {
	head, _, found := strings.Cut(rest, "-")
	if !found {
		return 0, 0, false
	}
	p, n, dotted := strings.Cut(head, ".")
	pid, err := strconv.Atoi(p)
	if err != nil || pid <= 0 {
		return 0, 0, false
	}
	if dotted {
		if ns, err = strconv.ParseUint(n, 10, 64); err != nil || ns == 0 {
			return 0, 0, false
		}
	}
	return pid, ns, true
}

func openShm(dir, name string, ringBytes int) (*shmSegment, error) {
	if !strings.HasPrefix(name, shmPrefix) || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("%w: bad shared-memory name %q", ErrProtocol, name)
	}
	if ringBytes < 1<<16 || ringBytes > 1<<30 || ringBytes&(ringBytes-1) != 0 {
		return nil, fmt.Errorf("%w: bad ring size %d", ErrProtocol, ringBytes)
	}
	path := filepath.Join(dir, name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("comm: opening %s: %w", path, err)
	}
	defer unix.Close(fd)
	size := shmSize(ringBytes)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size != int64(size) {
		return nil, fmt.Errorf("%w: %s has %d bytes, want %d", ErrProtocol, path, st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("comm: mapping %s: %w", path, err)
	}
	seg := &shmSegment{path: path, name: name, mem: mem, ringBytes: ringBytes}
	seg.prefault()
	seg.publishSession(1)
	return seg, nil
}

func (s *shmSegment) unlink() {
	if s.unlinked.CompareAndSwap(false, true) {
		_ = unix.Unlink(s.path)
	}
}

func (s *shmSegment) unmap() {
	s.unlink()
	if s.mem != nil {
		_ = unix.Munmap(s.mem)
		s.mem = nil
	}
}

// ring is one direction of a segment.
type ring struct {
	head, tail   *uint64 // bytes produced / consumed, monotonic
	consWait     *uint32 // futex: consumer sleeps waiting for data
	prodWait     *uint32 // futex: producer sleeps waiting for space
	data         []byte
	mask         uint64
	size         uint64
	pos          uint64 // producer side only: bytes written, maybe unpublished
	readTail     uint64 // consumer side only: local copy of tail
	remainingPad int    // consumer side only: pad bytes after the current payload
	// The waiting side's view of its peer (tx: under wmu; rx: the
	// receiver): slowPeer after a wait in which the peer's last CPU was
	// ours (or, if slowWait is set, a wait longer than it), until fastWaits
	// waits in a row end within yieldAfter. See wait.
	slowPeer  bool
	fastWaits int
}

// noteWait updates the ring's view of the peer after a wait of d;
// contended says the peer was found waiting on our CPU.
func (r *ring) noteWait(d time.Duration, contended bool) {
	switch sw := slowWait.get(); {
	case contended || (sw > 0 && d > sw):
		r.slowPeer, r.fastWaits = true, 0
	case r.slowPeer && d < yieldAfter.get():
		if r.fastWaits++; r.fastWaits >= fastWaitsToSpin {
			r.slowPeer, r.fastWaits = false, 0
		}
	}
}

func newRing(mem []byte, dir, ringBytes int) *ring {
	ctl := unsafe.Pointer(&mem[dir*dirCtlBytes])
	r := &ring{
		head:     (*uint64)(ctl),
		tail:     (*uint64)(unsafe.Add(ctl, cacheLine)),
		consWait: (*uint32)(unsafe.Add(ctl, 2*cacheLine)),
		prodWait: (*uint32)(unsafe.Add(ctl, 3*cacheLine)),
		data:     mem[shmCtlBytes+2*shmFastBytes+dir*ringBytes : shmCtlBytes+2*shmFastBytes+(dir+1)*ringBytes],
		size:     uint64(ringBytes),
		mask:     uint64(ringBytes - 1),
	}
	r.pos = atomic.LoadUint64(r.head)
	r.readTail = atomic.LoadUint64(r.tail)
	return r
}

// Futex operations on a shared (not process-private) word.
const (
	futexOpWait = 0
	futexOpWake = 1
)

func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(addr *uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWake, 1, 0, 0, 0)
}

// spinLimit is how long a waiter polls before sleeping on the futex: long
// enough to cover a peer's reaction time when both ranks are running (the
// latency path), short enough not to burn a shared core for long. A
// variable only so that benchmarks can try other values (SetTuning).
var spinLimit = tunable(200 * time.Microsecond)

// yieldAfter is how long a waiter polls before it starts yielding the CPU
// (it checks every 256 polls, about a microsecond). At its first yield a
// waiter publishes the CPU it runs on and compares it with the one its peer
// published at its own last yield: the same CPU means the peer is queued
// behind us, and from then on the waiter yields from the first check,
// until fastWaitsToSpin waits in a row end within yieldAfter.
//
// Why (2 ranks, 2 cores shared with other jobs): on a quiet host a peer
// answers within microseconds and spinning first is fastest (64 KiB
// all-reduce 15.7 µs spinning 10 µs first, 19.7 µs yielding at once;
// 256 KiB 43 vs 54 µs); when the ranks share a core, yielding at once
// measured 8 B 35 → 12 µs and 64 KiB 80 → 54 µs. Judging by wait length
// (slowWait) also caught legitimately long waits on a lightly loaded host
// (64 KiB 24 → 29 µs); the CPU comparison does not.
var yieldAfter = tunable(10 * time.Microsecond)

// yieldIdle makes a waiter yield after yieldAfter even when its peer runs
// on another core and the host has a core per rank (the policy before;
// benchmarks compare). Off: sched_yield hands the core to any runnable
// process on it, so on a host that other work loads each yield can turn
// a microsecond wait into a time slice, and a peer on another core gains
// nothing from it. notes/shm-latency.md has the measurements.
var yieldIdle atomic.Bool

// slowWait, when set, also treats a wait this long as a sign that the peer
// lacks a core. 0 (default): only the CPU comparison counts.
var slowWait = tunable(0)

// cpuCheck turns the CPU comparison on (benchmarks turn it off to compare).
var cpuCheck atomic.Bool

func init() { cpuCheck.Store(true) }

const fastWaitsToSpin = 32

// goschedAfter is how long a waiter polls before it lets the other
// goroutines of its process run (runtime.Gosched at every check, about
// every 0.3 µs), unless it knows from the start that one of them may be
// what it waits for (see wait). A rank bound to one CPU has one P, and
// every issue readies the communicator's worker: a Gosched then switches
// to the worker and back (it finds the run token taken), about 0.4 µs,
// which the 8-byte all-reduce paid in a tenth of its calls (2 ranks,
// through `gorun bench`, per-call p90 1.0-1.3 µs against a median of
// 0.58). A small message's answer comes within a few microseconds when
// the peer runs; after that, other goroutines get their turn.
var goschedAfter = tunable(3 * time.Microsecond)

// goschedOK reports whether a shared-memory waiter in mode may let this
// process's other goroutines run (runtime.Gosched) while it polls, given
// whether calls come from foreign threads (SetForeignCallers) and how many
// of our goroutines are inside a ring write. Go's own threads always may.
// With foreign callers a waiter may only where the hand-over is needed:
// while it waits for ring room (it is a writer, usually the sender
// goroutine, and the call's runner may be waiting for the P to drain the
// ring the peer's writer fills) or while a goroutine of ours is writing a
// ring frame (the peer may be waiting for it). A process with one P — a
// rank bound to one CPU, or given GOMAXPROCS=1 on a crowded host
// (launcher/supervisor/bind.go) — otherwise runs the two in turns only
// when a waiter sleeps on the futex and sysmon takes its P: 4 ranks on 2
// cores, 32 MiB in-place ring all-reduce from C through libgorun, 5
// interleaved rounds, medians 21.4 ms without these hand-overs, 14.0 ms
// with, native `gorun bench` 13.7 ms (notes/torch-backend.md).
func goschedOK(foreign bool, mode int, writers int32) bool {
	return !foreign || mode == waitTxRing || writers > 0
}

// ringWriters counts the goroutines of this process inside a ring write
// (Send of a frame too large for a fast slot): while one is, a waiter
// yields the P at once, as the frame it writes may be what unblocks the
// peer.
var ringWriters atomic.Int32

// errShmDead is returned once the link is closed or the peer is gone and
// the ring holds nothing more to read.
var errShmDead = errors.New("comm: shared-memory link closed")

// What a waiter waits for.
const (
	waitRxRing = iota // ring bytes to read (the rest of a ring frame)
	waitRxAny         // the next frame, in a fast slot or on the ring
	waitTxRing        // room on the ring
	waitTxFast        // a fast slot handed back
)

// ready reports whether what mode waits for holds now. No closures: this
// runs per poll.
func (l *shmLink) ready(mode int) bool {
	switch mode {
	case waitRxRing:
		return atomic.LoadUint64(l.rx.head) != l.rx.readTail
	case waitRxAny:
		return atomic.LoadUint64(l.rx.head) != l.rx.readTail || l.fastArrived()
	case waitTxRing:
		return l.tx.pos-atomic.LoadUint64(l.tx.tail) < l.tx.size
	default:
		l.ftx.seen = atomic.LoadUint64(l.ftx.consumed)
		return l.ftx.next-l.ftx.seen < fastSlots
	}
}

// wait polls until what mode waits for holds, then sleeps on the matching
// futex word (the receiver's for waitRx*, the sender's for waitTx*). It
// returns false once the link is dead and the condition still does not
// hold.
//
// The policy, spin then yield then sleep, is documented on yieldAfter and
// spinLimit: a waiter never burns a core for longer than spinLimit.
func (l *shmLink) wait(mode int) bool {
	r, w := l.rx, l.rx.consWait
	if mode >= waitTxRing {
		r, w = l.tx, l.tx.prodWait
	}
	if l.ready(mode) {
		if r.slowPeer {
			r.noteWait(0, false)
		}
		return true
	}
	yieldFrom := yieldAfter.get()
	if r.slowPeer || l.crowded {
		yieldFrom = 0
	}
	// Whether to let this process's other goroutines run at every check
	// from the start (see goschedAfter): when we wait for room (the
	// reader may be a goroutine of ours), when a goroutine of ours is
	// writing a ring frame (it may be what the peer waits for before it
	// answers), or when the peer is slow anyway.
	schedFrom := goschedAfter.get()
	writers := ringWriters.Load()
	if mode >= waitTxRing || writers > 0 || yieldFrom == 0 {
		schedFrom = 0
	}
	gosched := goschedOK(foreignCallers.Load(), mode, writers)
	start := time.Now()
	contended, checked := false, false
	for i := 0; ; i++ {
		if l.ready(mode) {
			r.noteWait(time.Since(start), contended)
			return true
		}
		if i&255 == 255 {
			if l.isDead() {
				return l.ready(mode)
			}
			spun := time.Since(start)
			if spun > spinLimit.get() {
				break
			}
			if spun >= schedFrom && gosched {
				runtime.Gosched()
			}
			if spun > yieldFrom {
				if !checked && cpuCheck.Load() {
					checked = true
					var cpu uint32
					if _, _, e := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); e == 0 {
						atomic.StoreUint32(l.myCPU, cpu+1)
						contended = atomic.LoadUint32(l.peerCPU) == cpu+1
						if l.crowded {
							rehome(cpu)
						}
					}
				}
				// The peer is not answering at memory speed. If it is
				// queued behind us on this core, or the host has more
				// ranks than cores, give the core up. When both ranks are
				// in one session (gorun starts oversubscribed ranks in
				// its own, launcher/supervisor/bind.go), sched_yield hands the core
				// to the peer queued behind us and keep polling: a
				// switch, where a futex sleep costs the peer a wake-up
				// and us a place in the run queue (4 ranks on 2 cores,
				// 8-byte all-reduce: 8-17 µs yielding, 20-90 µs
				// sleeping, notes/shm-latency.md). In sessions of their
				// own, with the kernel's autogroup scheduling each rank
				// is alone in its group and a yield gives the core to
				// nobody (0.3-1.3 ms): sleep on the futex at once. A
				// peer on another core gains nothing from either, while
				// we would lose the core to any other process for a
				// time slice (see yieldIdle): then keep polling until
				// spinLimit.
				if contended || r.slowPeer || l.crowded {
					if !l.yieldOK {
						break
					}
					_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
				}
				if yieldIdle.Load() && !contended && !r.slowPeer && !l.crowded {
					_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
				}
			}
		}
	}
	unbatch()
	for {
		atomic.StoreUint32(w, 1)
		if l.ready(mode) {
			atomic.StoreUint32(w, 0)
			r.noteWait(time.Since(start), contended)
			return true
		}
		if l.isDead() {
			atomic.StoreUint32(w, 0)
			return l.ready(mode)
		}
		futexWait(w, 1, 100*time.Millisecond)
	}
}

// markCrowded tells the group's shared-memory and TCP links whether the
// host runs more of its ranks than it has online CPUs (see shmLink.crowded
// and tcpYieldSpin).
func markCrowded(links []Link, localRanks int) {
	crowded := localRanks > onlineCPUs()
	for _, l := range links {
		if t, ok := l.(*tcpLink); ok {
			t.setCrowded(crowded)
		}
		if s, ok := l.(*shmLink); ok {
			s.crowded = crowded
			mine, theirs := s.seg.session(s.side), s.seg.session(1-s.side)
			s.yieldOK = mine != 0 && mine == theirs
		}
	}
}

// onlineCPUs counts the host's online CPUs (not this process's affinity:
// ranks bound to a share of the host still have a core each).
func onlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return runtime.NumCPU()
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, ok := strings.Cut(r, "-")
		a, err1 := strconv.Atoi(lo)
		z, err2 := strconv.Atoi(hi)
		switch {
		case !ok && err1 == nil:
			n++
		case ok && err1 == nil && err2 == nil && z >= a:
			n += z - a + 1
		default:
			return runtime.NumCPU()
		}
	}
	return max(n, 1)
}

// fastDir is one direction's fast slots, seen from one side.
type fastDir struct {
	slots    []byte  // fastSlots × fastSlotBytes in the segment
	consumed *uint64 // slots the receiver has read, written by it only
	// Sender side (under wmu): slots written, and the receiver's count as
	// last read. Receiver side: slots read (next is the one it polls).
	next, seen uint64
}

func (f *fastDir) slot(i uint64) []byte {
	o := int(i%fastSlots) * fastSlotBytes
	return f.slots[o : o+fastSlotBytes : o+fastSlotBytes]
}

func flagOf(slot []byte) *uint64 { return (*uint64)(unsafe.Pointer(unsafe.SliceData(slot))) }

// shmLink is a Link over a shared-memory segment, with the handshake's TCP
// connection kept for liveness.
type shmLink struct {
	conn net.Conn
	br   *bufio.Reader
	seg  *shmSegment
	gid  GroupID // the link's group: fast slots do not carry it
	tx   *ring
	rx   *ring
	ftx  fastDir // fast slots we write (next, seen: under wmu)
	frx  fastDir // fast slots we read (receive side)

	wmu sync.Mutex // serializes producers so frames never interleave

	// The mapping's lifetime: state counts the calls inside the mapping
	// (low bits) and has shmClosed set by Close; whoever brings it to
	// shmClosed with no call inside unmaps. An atomic rather than a mutex:
	// every Send, RecvHeader and Recv* enters and exits, three lock pairs
	// per small collective on the latency path. mu orders the unmapping
	// against wakeAll, which must not touch an unmapped segment.
	state atomic.Int64
	mu    sync.Mutex

	// Where this side publishes its waiting thread's CPU, and where the
	// peer does (see yieldAfter).
	myCPU, peerCPU *uint32
	// crowded: the host runs more of the group's ranks than it has CPUs,
	// so a waiter yields after yieldAfter whatever the CPU comparison
	// says (set once by the endpoint, before use).
	crowded bool
	// yieldOK: both sides published one scheduling-group tag (one
	// session's autogroup, or one cpu cgroup: schedGroupTag), where
	// sched_yield hands the core to the other if it is queued behind us
	// (see wait).
	// Set with crowded. side: 0 for the dialer, 1 for the acceptor.
	yieldOK bool
	side    int

	dead   atomic.Bool // closed locally or peer gone
	peerGo chan struct{}
	hdr    [HeaderSize]byte // receive side only
	whdr   [HeaderSize]byte // guarded by wmu
	zeros  [8]byte
	wg     sync.WaitGroup

	// Frame numbers across both paths: sent (under wmu) and received.
	sent, recvd uint64
	// Receive side: the current frame's payload when it is in a fast slot
	// (fastCur), which is handed back once read (fastHeld); and a ring
	// header read ahead of a fast frame that had to be delivered first.
	fastCur  []byte
	fastHeld bool
	stashed  bool
	stash    [HeaderSize]byte
}

var _ Link = (*shmLink)(nil)
var _ ReduceReceiver = (*shmLink)(nil)

func newShmLink(conn net.Conn, br *bufio.Reader, seg *shmSegment, gid GroupID, dialer bool) *shmLink {
	tx, rx := 0, 1
	if !dialer {
		tx, rx = 1, 0
	}
	l := &shmLink{conn: conn, br: br, seg: seg, gid: gid,
		tx: newRing(seg.mem, tx, seg.ringBytes), rx: newRing(seg.mem, rx, seg.ringBytes),
		ftx: newFastDir(seg.mem, tx), frx: newFastDir(seg.mem, rx),
		peerGo: make(chan struct{})}
	side := tx // 0 for the dialer, 1 for the acceptor
	l.side = side
	l.myCPU = (*uint32)(unsafe.Pointer(&seg.mem[cpuCtlOff+side*cacheLine]))
	l.peerCPU = (*uint32)(unsafe.Pointer(&seg.mem[cpuCtlOff+(1-side)*cacheLine]))
	l.wg.Go(l.watch)
	return l
}

func newFastDir(mem []byte, dir int) fastDir {
	o := shmCtlBytes + dir*shmFastBytes
	return fastDir{slots: mem[o : o+shmFastBytes : o+shmFastBytes],
		consumed: (*uint64)(unsafe.Pointer(&mem[fastCtlOff+dir*cacheLine]))}
}

// watch blocks on the control connection: nothing is ever sent on it, so
// any return means the peer closed, crashed or misbehaved.
func (l *shmLink) watch() {
	_, _ = io.Copy(io.Discard, l.br)
	l.dead.Store(true)
	close(l.peerGo)
	l.wakeAll()
}

func (l *shmLink) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seg.mem == nil {
		return
	}
	for _, r := range []*ring{l.tx, l.rx} {
		atomic.StoreUint32(r.consWait, 0)
		futexWake(r.consWait)
		atomic.StoreUint32(r.prodWait, 0)
		futexWake(r.prodWait)
	}
}

// shmClosed is the bit of shmLink.state that Close sets.
const shmClosed = 1 << 40

func (l *shmLink) enter() bool {
	if l.state.Add(1)&shmClosed != 0 {
		l.exit()
		return false
	}
	return true
}

func (l *shmLink) exit() {
	if l.state.Add(-1) == shmClosed {
		l.unmap()
	}
}

// unmap releases the segment (idempotent).
func (l *shmLink) unmap() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seg.unmap()
}

func (l *shmLink) isDead() bool { return l.dead.Load() }

// write appends b to the ring, publishing at every 8-byte boundary it
// reaches, waiting for space as needed.
func (l *shmLink) write(b []byte) bool {
	r := l.tx
	for len(b) > 0 {
		if r.pos-atomic.LoadUint64(r.tail) == r.size && !l.wait(waitTxRing) {
			return false
		}
		free := r.size - (r.pos - atomic.LoadUint64(r.tail))
		off := r.pos & r.mask
		n := min(uint64(len(b)), free, r.size-off)
		copy(r.data[off:off+n], b[:n])
		r.pos += n
		b = b[n:]
		if r.pos&7 == 0 {
			l.publish()
		}
	}
	return true
}

func (l *shmLink) publish() {
	r := l.tx
	atomic.StoreUint64(r.head, r.pos)
	l.wakeReceiver()
}

// wakeReceiver wakes the peer if it sleeps waiting for a frame.
func (l *shmLink) wakeReceiver() {
	if w := l.tx.consWait; atomic.LoadUint32(w) != 0 {
		atomic.StoreUint32(w, 0)
		futexWake(w)
	}
}

// Send puts the frame in a fast slot when it is a whole data message of
// at most fastLimit bytes, else copies it into the ring; it blocks while
// the slots or the ring are full, that is until the peer has read enough.
// Safe for concurrent use.
func (l *shmLink) Send(h *Header, payload []byte) error {
	if !l.enter() {
		return errShmDead
	}
	defer l.exit()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.isDead() {
		return errShmDead
	}
	if h.Frame == frameData && h.Aux == h.Len && len(payload) <= int(fastLimit.Load()) {
		return l.sendFast(h, payload)
	}
	ringWriters.Add(1)
	defer ringWriters.Add(-1)
	// The skip record itself must fit before the ring's end: written across
	// the end, it would carry the producer into the next lap, and the skip
	// would then put it more than a ring ahead of the consumer (free space
	// underflows and the next frame overwrites unread bytes, the record
	// among them). That close to the end there is nothing to skip anyway.
	if r := l.tx; !l.lapsRing(h) && r.pos&r.mask >= l.wrapFrom() && r.pos&r.mask+HeaderSize < r.size && atomic.LoadUint64(r.tail) == r.pos {
		// The peer has read everything: rather than go on through the
		// rest of the ring, whose lines have left both cores' caches since
		// the last lap, start again at the beginning, which the last
		// frames used. Light traffic then keeps reusing the same cached
		// lines (on the 2-core reference host a 4 MiB ring used end to end
		// cost 256 KiB all-reduces ~30% against a 1 MiB one); streams that
		// keep the ring non-empty still use all of it. Frames of a message
		// that laps the ring anyway go on (see lapsRing).
		l.whdr = [HeaderSize]byte{0: headerMagic, 1: shmFrameSkip}
		if !l.write(l.whdr[:]) {
			return errShmDead
		}
		r.pos += (r.size - r.pos&r.mask) & r.mask
		l.publish()
	}
	h.Encode(l.whdr[:])
	binary.LittleEndian.PutUint32(l.whdr[12:], uint32(l.sent))
	l.sent++
	if !l.write(l.whdr[:]) || !l.write(payload) {
		return errShmDead
	}
	if pad := (8 - len(payload)&7) & 7; pad > 0 && !l.write(l.zeros[:pad]) {
		return errShmDead
	}
	l.publish()
	return nil
}

// lapsRing reports whether h is a frame of a data message at least as long
// as the ring (Aux holds a data frame's message length). Such a message
// cycles through every line of the ring whatever the producer does, so
// going back to the ring's beginning whenever the peer has caught up only
// shortens the distance between the lines we write and the lines the peer
// has just read: the pair exchange (algo.go), which drains the ring at
// every segment, then rewrote the same few hundred KiB over and over, each
// line still held by the other core. Going on through the ring measured
// faster on the 2-core reference VM where its two vCPUs sit far apart
// (2-rank all-reduce, 16 MiB 3.19 -> 2.59 ms, 32 MiB 7.13 -> 5.12 ms) and
// the same where they sit near (notes/shm-latency.md); smaller
// messages keep skipping back, which is what keeps them in cache.
func (l *shmLink) lapsRing(h *Header) bool {
	return h.Frame == frameData && h.Aux >= l.tx.size
}

// sendFast writes a frame into the next fast slot: header and payload
// first, the flag last, so that a receiver that sees the flag sees the
// whole frame (stores are not reordered with older stores on amd64, and
// the atomic store orders them for the Go memory model). Under wmu.
//
// Slot layout: flag (frame number + 1) at 0, frame type, kind, dtype and
// op at 8-11, root at 12, call sequence at 16, count at 24, payload length
// at 32, payload from fastHdrBytes. Aux is the length (a whole message).
func (l *shmLink) sendFast(h *Header, payload []byte) error {
	f := &l.ftx
	if f.next-f.seen >= fastSlots && !l.ready(waitTxFast) && !l.wait(waitTxFast) {
		return errShmDead
	}
	s := f.slot(f.next)
	s[8], s[9], s[10], s[11] = h.Frame, byte(h.Kind), byte(h.DType), byte(h.Op)
	binary.LittleEndian.PutUint32(s[12:], uint32(h.Root))
	binary.LittleEndian.PutUint64(s[16:], h.Seq)
	binary.LittleEndian.PutUint64(s[24:], h.Count)
	binary.LittleEndian.PutUint64(s[32:], uint64(len(payload)))
	copy(s[fastHdrBytes:], payload)
	atomic.StoreUint64(flagOf(s), l.sent+1)
	f.next++
	l.sent++
	l.wakeReceiver()
	return nil
}

// fastArrived reports whether the next frame is in the next fast slot.
func (l *shmLink) fastArrived() bool {
	return atomic.LoadUint64(flagOf(l.frx.slot(l.frx.next))) == l.recvd+1
}

// releaseFast hands the current fast slot back to the sender.
func (l *shmLink) releaseFast() {
	if !l.fastHeld {
		return
	}
	l.fastHeld, l.fastCur = false, nil
	f := &l.frx
	f.next++
	atomic.StoreUint64(f.consumed, f.next)
	if w := l.rx.prodWait; atomic.LoadUint32(w) != 0 {
		atomic.StoreUint32(w, 0)
		futexWake(w)
	}
}

// avail waits until at least one ring byte can be read and returns how many.
func (l *shmLink) avail() (uint64, bool) {
	r := l.rx
	if atomic.LoadUint64(r.head) == r.readTail && !l.wait(waitRxRing) {
		return 0, false
	}
	return atomic.LoadUint64(r.head) - r.readTail, true
}

func (l *shmLink) consume(n uint64) {
	r := l.rx
	r.readTail += n
	atomic.StoreUint64(r.tail, r.readTail)
	if atomic.LoadUint32(r.prodWait) != 0 {
		atomic.StoreUint32(r.prodWait, 0)
		futexWake(r.prodWait)
	}
}

// read consumes the next want stream bytes piece by piece (contiguous ring
// regions): copied into dst, folded into dst with reduce when it is set, or
// skipped when dst is nil.
func (l *shmLink) read(want int, dst []byte, reduce func(dst, src []byte)) bool {
	r := l.rx
	for off := 0; off < want; {
		a, ok := l.avail()
		if !ok {
			return false
		}
		pos := r.readTail & r.mask
		n := min(a, uint64(want-off), r.size-pos)
		src := r.data[pos : pos+n]
		switch {
		case dst == nil:
		case reduce != nil:
			reduce(dst[off:off+int(n)], src)
		default:
			copy(dst[off:], src)
		}
		off += int(n)
		l.consume(n)
	}
	return true
}

// RecvHeader blocks for the next header, from a fast slot or the ring,
// in the order the peer sent them. Receive side: one goroutine. A dead
// link still yields what the peer wrote before it went (its abort frame,
// typically).
func (l *shmLink) RecvHeader(h *Header) error {
	if !l.enter() {
		return errShmDead
	}
	defer l.exit()
	l.releaseFast() // a frame whose payload nobody read (an error path)
	for {
		if l.fastArrived() {
			return l.fastHeader(h)
		}
		if l.stashed {
			// A ring header read earlier, which had to wait for the fast
			// frame sent before it.
			if n := binary.LittleEndian.Uint32(l.stash[12:]); n != uint32(l.recvd) {
				// The ring frame was published after every frame before
				// it, so a gap with no fast frame to fill it is the
				// peer's bug, not a race.
				return fmt.Errorf("%w: ring frame %d while frame %d is not in its fast slot", ErrProtocol, n, uint32(l.recvd))
			}
			l.stashed = false
			if err := h.Decode(l.stash[:]); err != nil {
				return err
			}
			l.recvd++
			l.rx.remainingPad = int((8 - h.Len&7) & 7)
			return nil
		}
		if atomic.LoadUint64(l.rx.head) == l.rx.readTail {
			if !l.wait(waitRxAny) {
				return io.EOF
			}
			continue
		}
		if testBeforeRingHeader != nil {
			testBeforeRingHeader(l)
		}
		if !l.read(HeaderSize, l.stash[:], nil) {
			return io.EOF
		}
		if l.stash[0] == headerMagic && l.stash[1] == shmFrameSkip {
			// The producer went back to the ring's beginning (see Send).
			r := l.rx
			if skip := (r.size - r.readTail&r.mask) & r.mask; skip > 0 && !l.read(int(skip), nil, nil) {
				return io.EOF
			}
			continue
		}
		// Deliver it on the next turn, unless the frame before it is
		// waiting in a fast slot.
		l.stashed = true
	}
}

// testBeforeRingHeader, set by tests only, runs just before RecvHeader
// reads a header from the ring: it lets a test publish a fast frame in the
// window between the receiver's look at the fast slot and its read of the
// ring, which otherwise only a race opens.
var testBeforeRingHeader func(*shmLink)

// fastHeader delivers the frame in the next fast slot.
func (l *shmLink) fastHeader(h *Header) error {
	s := l.frx.slot(l.frx.next)
	n := binary.LittleEndian.Uint64(s[32:])
	if n > fastMaxPayload || s[8] != frameData {
		return fmt.Errorf("%w: fast slot holds frame type %d of %d bytes", ErrProtocol, s[8], n)
	}
	*h = Header{Frame: s[8], Kind: Kind(s[9]), DType: DType(s[10]), Op: Op(s[11]),
		Root: int32(binary.LittleEndian.Uint32(s[12:])), Group: l.gid,
		Seq: binary.LittleEndian.Uint64(s[16:]), Count: binary.LittleEndian.Uint64(s[24:]),
		Aux: n, Len: n}
	l.fastCur, l.fastHeld = s[fastHdrBytes:fastHdrBytes+n:fastHdrBytes+n], true
	l.recvd++
	return nil
}

func (l *shmLink) skipPad() bool {
	p := l.rx.remainingPad
	l.rx.remainingPad = 0
	return p == 0 || l.read(p, nil, nil)
}

// RecvPayload copies the current frame's payload out of its fast slot or
// the ring.
func (l *shmLink) RecvPayload(dst []byte) error {
	if !l.enter() {
		return errShmDead
	}
	defer l.exit()
	if l.fastHeld {
		if len(dst) != len(l.fastCur) {
			return fmt.Errorf("%w: reading %d bytes of a %d-byte frame", ErrProtocol, len(dst), len(l.fastCur))
		}
		copy(dst, l.fastCur)
		l.releaseFast()
		return nil
	}
	if !l.read(len(dst), dst, nil) || !l.skipPad() {
		return io.EOF
	}
	return nil
}

// RecvReduce folds the current frame's payload into dst straight from its
// fast slot or the ring, saving the copy RecvPayload would make. Ring
// pieces are multiples of 8 bytes except the last, so they hold whole
// elements.
func (l *shmLink) RecvReduce(dst []byte, f func(dst, src []byte)) error {
	if !l.enter() {
		return errShmDead
	}
	defer l.exit()
	if l.fastHeld {
		if len(dst) != len(l.fastCur) {
			return fmt.Errorf("%w: reducing %d bytes of a %d-byte frame", ErrProtocol, len(dst), len(l.fastCur))
		}
		if len(dst) > 0 {
			f(dst, l.fastCur)
		}
		l.releaseFast()
		return nil
	}
	if !l.read(len(dst), dst, f) || !l.skipPad() {
		return io.EOF
	}
	return nil
}

// EagerLimit: a thirty-second of the ring (128 KiB for the default 4 MiB),
// so that two frames in flight fit in the part of the ring that is free
// after a skip to its beginning (see wrapFrom), and skips start about
// 256 KiB in. Measured on the 2-core host against a sixteenth (skips from
// about 512 KiB): 64 KiB all-reduce 22 vs 27 us, 1 MiB 217 vs 258 us,
// 64 MiB 20 vs 28 ms (best of 3 interleaved runs each). Fast slots take
// any number of small frames up to fastSlots.
func (l *shmLink) EagerLimit() int { return l.seg.ringBytes / 32 }

// wrapFrom is how far into the ring a producer that finds it empty must be
// to skip to its beginning. Until the consumer reads the skip record the
// skipped bytes count as unread, so the rest (the offset, less the record)
// must still hold the two frames of up to EagerLimit bytes, with header and
// padding, that Send promises to take without the peer reading; otherwise
// two ranks that both send before they receive could wait for each other.
func (l *shmLink) wrapFrom() uint64 {
	return uint64(2*(l.EagerLimit()+HeaderSize+8) + HeaderSize)
}

func (l *shmLink) Kind() string { return "shm" }

// Close marks the link dead, wakes every waiter, closes the control
// connection (the peer's watcher sees it) and unmaps the segment once no
// call is inside it. Idempotent.
func (l *shmLink) Close() error {
	for {
		st := l.state.Load()
		if st&shmClosed != 0 {
			return nil
		}
		if l.state.CompareAndSwap(st, st|shmClosed) {
			break
		}
	}
	l.dead.Store(true)
	l.wakeAll()
	_ = l.conn.Close()
	l.wg.Wait()
	// The last call to exit unmaps if one is still inside.
	if l.state.Load() == shmClosed {
		l.unmap()
	}
	return nil
}
