package hbone

// Frame boundaries of the HTTP/2 byte streams under a pooled connection.
//
// net/http's HTTP/2 client has no API to reset a stream with a code of our
// choosing (a failing request body makes it send CANCEL, which HBONE reads
// as a clean end), nor to tell which stream ID a request got, nor which
// last stream ID a GOAWAY named. poolNetConn sits between that client and
// TLS, so it follows the frame boundaries of both directions (9-byte
// headers, RFC 9113 §4.1): outgoing, to learn the ID of each HEADERS frame
// and to slip our own RST_STREAM in between two frames; incoming, to read
// GOAWAY's last stream ID. Only frame headers are parsed, never payloads,
// except the four bytes of a GOAWAY's last stream ID.

import (
	"encoding/binary"
	"math"

	"golang.org/x/net/http2"
)

// HTTP/2 frame types and sizes used here (RFC 9113 §6).
const (
	frameHeaderLen   = 9
	frameTypeHeaders = 0x1
	frameTypeRST     = 0x3
	frameTypeGoAway  = 0x7
)

// frameWalker follows frame boundaries across arbitrary chunks of a byte
// stream. Its zero value starts at a frame boundary; skip passes a prefix
// (the client preface) first.
type frameWalker struct {
	skip    int
	hdr     [frameHeaderLen]byte
	hdrLen  int
	remain  int    // payload bytes of the current frame still to pass
	typ     uint8  // of the current frame
	stream  uint32 // of the current frame
	want    int    // payload bytes to capture from the current frame
	capture [4]byte
	got     int

	// onHeader is called with each complete frame header; it returns how
	// many payload bytes (at most 4) onPayload should get.
	onHeader func(typ uint8, stream uint32, length int) int
	// onPayload gets the captured start of the payload.
	onPayload func(typ uint8, stream uint32, payload []byte)
}

// atBoundary reports whether the bytes walked so far end a frame.
func (w *frameWalker) atBoundary() bool {
	return w.skip == 0 && w.hdrLen == 0 && w.remain == 0
}

// walk consumes b and returns how many bytes it took: all of b, or, if
// stop is set, only up to the first frame boundary it reaches after
// consuming at least one byte.
func (w *frameWalker) walk(b []byte, stop bool) int {
	n := 0
	for n < len(b) {
		switch {
		case w.skip > 0:
			k := min(w.skip, len(b)-n)
			w.skip -= k
			n += k
		case w.remain > 0:
			k := min(w.remain, len(b)-n)
			if w.got < w.want {
				c := copy(w.capture[w.got:w.want], b[n:n+k])
				w.got += c
				if w.got == w.want && w.onPayload != nil {
					w.onPayload(w.typ, w.stream, w.capture[:w.want])
				}
			}
			w.remain -= k
			n += k
		default:
			k := copy(w.hdr[w.hdrLen:], b[n:])
			w.hdrLen += k
			n += k
			if w.hdrLen < frameHeaderLen {
				continue
			}
			w.hdrLen = 0
			length := int(w.hdr[0])<<16 | int(w.hdr[1])<<8 | int(w.hdr[2])
			w.typ = w.hdr[3]
			w.stream = binary.BigEndian.Uint32(w.hdr[5:]) & math.MaxInt32
			w.remain, w.want, w.got = length, 0, 0
			if w.onHeader != nil {
				w.want = min(w.onHeader(w.typ, w.stream, length), length, len(w.capture))
			}
		}
		if stop && w.atBoundary() {
			break
		}
	}
	return n
}

// rstFrame is RST_STREAM(code) on stream id.
func rstFrame(id uint32, code http2.ErrCode) []byte {
	f := make([]byte, frameHeaderLen+4)
	f[2] = 4
	f[3] = frameTypeRST
	binary.BigEndian.PutUint32(f[5:], id)
	binary.BigEndian.PutUint32(f[9:], uint32(code))
	return f
}
