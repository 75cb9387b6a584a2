package hbone

import (
	"errors"
	"fmt"
	"net/http"
)

// ErrStreamReset is what a stream's Read returns (wrapped) when the peer
// reset the stream with a code other than NO_ERROR or CANCEL: the proxied
// TCP connection ended abnormally, and the local side should be reset too.
// RST_STREAM with NO_ERROR or CANCEL reads as a clean io.EOF.
var ErrStreamReset = errors.New("hbone: stream reset by peer")

// StatusError is a CONNECT answered with something other than 200.
type StatusError struct {
	Code int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("hbone: CONNECT refused: %d %s", e.Code, http.StatusText(e.Code))
}
