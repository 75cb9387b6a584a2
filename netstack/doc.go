// Package netstack terminates the TCP connections routed into a TUN device
// with gVisor's userspace TCP/IP stack and hands each one to a Handler.
//
// The stack is a catch-all: its NIC is promiscuous and spoofing, with
// default routes for 0.0.0.0/0 and ::/0, so it answers a SYN to any
// destination, and the destination the client dialled is preserved. It
// speaks IPv4 and IPv6, TCP only; UDP and ICMP are not forwarded.
//
// Setup order (New does it all):
//
//  1. a gVisor stack with IPv4, IPv6 and TCP, SACK on;
//  2. the TCP forwarder, installed before the NIC exists so that no SYN
//     can arrive unhandled;
//  3. the link endpoint over the TUN fd, MTU of the device: fdbased (IP
//     packets, no Ethernet header) for a plain device, or our own vnetLink
//     (vnet.go: virtio_net_hdr, TSO super-packets both ways, GRO) for a
//     device opened with offload; or, instead of a TUN, the endpoint
//     given in Options.Link; whichever it is wrapped in loopbackLink
//     (loopback.go), which makes the IPv4 catch-all constant-time;
//  4. the NIC, with one permanent 0/0 IPv4 address, promiscuous and
//     spoofing, and the default routes.
//
// Use from another package:
//
//	dev, _ := tun.Open(tun.Options{Name: "meshtun0", Routes: ...})
//	st, _ := netstack.New(netstack.Options{Device: dev, Handler: h, Logger: log})
//	...
//	st.Close() // stops the stack and waits for running Handlers
//	dev.Close()
//
// Each SYN becomes a Request given to the Handler in its own goroutine.
// The Handler decides: Accept completes the client's handshake and returns
// the Conn, Reject answers with a RST. A Handler that returns without
// deciding has rejected the request. The intended use is dial first: open
// the upstream, then Accept on success or Reject on failure, then relay
// with half-close (Conn.CloseWrite) inside the Handler.
//
// Tests that need no root give New gVisor's channel endpoint as
// Options.Link: they inject the client's IP packets and read the stack's
// answers (channel_test.go). The tests over a TUN in a network namespace
// remain the proof of the fdbased and vnet paths.
package netstack
