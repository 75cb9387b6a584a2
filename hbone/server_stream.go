package hbone

import (
	"context"
	"errors"
)

// Errors of the server's decisions.
var (
	errSrvRejected = errors.New("hbone: CONNECT was rejected")
	errSrvDecided  = errors.New("hbone: CONNECT already answered")
)

// ServerStream is an accepted CONNECT stream: the bytes of one proxied TCP
// connection. Its Read, WriteBufferedTo, Write, ReadFrom, CloseWrite,
// Reset and Close are the engine's (h2stream.go): Read and Write may be
// used concurrently with each other; Reset and Close may be called at
// any time and unblock both. Close also releases the Request's Context;
// every accepted stream must be closed.
type ServerStream struct {
	h2Stream
	ctx     context.Context // the Request's; cancelled when the stream fails or closes
	decided bool            // Accept or Reject was called (or the server answered); guarded by h2Conn.mu
}
