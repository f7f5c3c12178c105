package comm

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"
)

// Single-copy all-reduce between two ranks on one host.
//
// The pair exchange (pairAllReduce) moves every byte through the shared
// segment: the sender copies it in, the receiver reduces or copies it out,
// and each half crosses the cores twice (once as input, once as result).
// Where the kernel lets one process read another's memory (cross-memory
// attach, process_vm_readv, as Open MPI's vader transport does above 32
// KiB), each rank instead reads the half it reduces straight out of the
// peer's input buffer, a cache-sized piece at a time, reduces it into its
// own result, and then reads the other half, reduced by the peer, straight
// out of the peer's result buffer. Per rank that is one copy of the vector
// instead of three halves copied and one reduced through the ring, and no
// ring space, wrap-around or per-segment handshake.
//
// Three small messages each way order the reads against the buffers'
// lifetimes (both ranks run the same steps):
//
//  1. addresses: whether this side can read the peer (probed once per
//     link), and the addresses of its input and result buffers. If either
//     side cannot read the other, both fall back to the pair exchange in
//     the same call, and the pair never tries again (both saw the same
//     two flags).
//  2. reduced: this rank has reduced its half, so it has finished reading
//     the peer's input; the peer may overwrite its input (an in-place call
//     writes its result over it) and may read our result.
//  3. done: this rank has read the peer's result; the peer may return, and
//     its caller reuse the buffers.
//
// A peer that dies mid-call makes process_vm_readv fail (the process is
// gone) or its link fail; either is reported as that peer's loss. Reads
// only ever write this process's own buffers, so a peer that misbehaves
// cannot corrupt anything here but the call's result, which then fails.

// peerReader is the optional capability of a Link to a process on the same
// host: reading the peer's memory directly. Implemented by shared-memory
// links on Linux; not by links wrapped for fault injection, whose faults
// must apply to every byte.
type peerReader interface {
	// peerReadable reports whether this side may read the peer process's
	// memory, probed at first use and remembered. Worker only.
	peerReadable() bool
	// readPeer copies len(dst) bytes at address addr of the peer process
	// into dst. Worker only.
	readPeer(dst []byte, addr uintptr) error
}

// peerReadMin is the smallest all-reduce (in bytes of the compute type)
// that takes the single-copy path. Every rank must use the same value (it
// decides the algorithm); a package variable so that benchmarks and tests
// can compare (SetPeerReadMin in export_test.go). The default is where the
// single copy started to win on the 2-core reference host
// (notes/shm-latency.md, session 6).
var peerReadMin atomic.Int64

func init() { peerReadMin.Store(64 << 10) }

var expFull = os.Getenv("GORUN_EXP_FULL") == "1"

// peerReadAddrs is the size of the first message: readable flag, input
// address, result address.
const peerReadAddrs = 24

// readsPeer reports whether a two-rank all-reduce of size bytes takes the
// single-copy path (it may still fall back after the address exchange).
func (c *Comm) readsPeer(size int) bool {
	if c.n != 2 || size < int(peerReadMin.Load()) {
		return false
	}
	pe := c.peers[1-c.me]
	_, ok := pe.link.(peerReader)
	return ok && !pe.noPeerRead
}

// readAllReduce is the two-rank single-copy all-reduce described above: src
// holds this rank's contribution and data receives the result (the same
// slice, or not overlapping). It reports done=false, having sent and
// received nothing but the addresses, when either side cannot read the
// other; the caller then runs another algorithm.
func (c *Comm) readAllReduce(cl *call, ct DType, src, data []byte) (done bool, err error) {
	me, es := c.me, ct.Size()
	p := 1 - me
	pe := c.peers[p]
	pr := pe.link.(peerReader)

	ok := pr.peerReadable()
	var flag uint64
	if ok {
		flag = 1
	}
	mine, theirs := c.readTx[:], c.readRx[:]
	binary.LittleEndian.PutUint64(mine[0:], flag)
	binary.LittleEndian.PutUint64(mine[8:], uint64(addrOf(src)))
	binary.LittleEndian.PutUint64(mine[16:], uint64(addrOf(data)))
	if err := c.sendRecv(cl, p, mine, p, theirs, false, nil, 0); err != nil {
		return true, err
	}
	if !ok || binary.LittleEndian.Uint64(theirs[0:]) != 1 {
		pe.noPeerRead = true
		return false, nil
	}
	peerSrc := uintptr(binary.LittleEndian.Uint64(theirs[8:]))
	peerData := uintptr(binary.LittleEndian.Uint64(theirs[16:]))
	if expFull && !sameMem(src, data) {
		piece := max(c.cfg.SegmentBytes/es*es, es)
		tmp := c.scratch(1, min(piece, len(data)))
		for off := 0; off < len(data); off += piece {
			n := min(piece, len(data)-off)
			if err := pr.readPeer(tmp[:n], peerSrc+uintptr(off)); err != nil {
				return true, c.peerReadErr(p, err)
			}
			reduce3(cl.op, ct, data[off:off+n], src[off:off+n], tmp[:n])
		}
		return true, c.sendRecv(cl, p, nil, p, nil, false, nil, 0) // done
	}

	// Chunk p of the vector is ours to reduce, chunk me the peer's; both
	// ranks cut the same length the same way, so offsets agree.
	red, local := chunkOf(data, es, 2, p), chunkOf(src, es, 2, p)
	redOff := uintptr(chunkOffset(data, red))
	back := chunkOf(data, es, 2, me)
	backOff := uintptr(chunkOffset(data, back))

	// A piece of the peer's input is read into a cache-sized scratch buffer
	// and folded into our result from there while it is still in cache.
	piece := max(c.cfg.SegmentBytes/es*es, es)
	tmp := c.scratch(1, min(piece, len(red)))
	for off := 0; off < len(red); off += piece {
		n := min(piece, len(red)-off)
		if err := pr.readPeer(tmp[:n], peerSrc+redOff+uintptr(off)); err != nil {
			return true, c.peerReadErr(p, err)
		}
		reduce3(cl.op, ct, red[off:off+n], local[off:off+n], tmp[:n])
	}
	if err := c.sendRecv(cl, p, nil, p, nil, false, nil, 0); err != nil { // reduced
		return true, err
	}
	if len(back) > 0 {
		if err := pr.readPeer(back, peerData+backOff); err != nil {
			return true, c.peerReadErr(p, err)
		}
	}
	return true, c.sendRecv(cl, p, nil, p, nil, false, nil, 0) // done
}

// peerReadErr names the peer whose memory could not be read: it exited or
// crashed (its link reports the same shortly), or, if it still runs, it
// unmapped a buffer of a call in progress.
func (c *Comm) peerReadErr(p int, err error) error {
	return c.linkErr(p, fmt.Errorf("reading its memory: %w", err))
}

// addrOf is the address of b's first byte (0 for an empty slice).
func addrOf(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}

// chunkOffset is the offset of chunk within buf (chunk is a subslice of
// buf; 0 when it is empty).
func chunkOffset(buf, chunk []byte) int {
	if len(chunk) == 0 {
		return 0
	}
	return int(addrOf(chunk) - addrOf(buf))
}
