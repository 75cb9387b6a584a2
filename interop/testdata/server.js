// An HBONE server written against Node's http2 module (nghttp2 + OpenSSL),
// independent of meshtun's own server. The Go test passes a JSON config
// as argv[2]: {ca, cert, key, maxStreams}. It listens on 127.0.0.1 and
// prints one JSON line per event:
//   {ev: "listening", port}
//   {ev: "conn", n, alpn, version, cipher, sni, peerSAN}   a TLS connection
//   {ev: "stream", authority, method, headers}          a request
//   {ev: "close", authority, rstCode}                   a stream ended
// What it does with a CONNECT depends on the target port of :authority:
//   7001: 200, "partial", then close(CONNECT_ERROR): nghttp2 sends
//         END_STREAM first and the RST_STREAM after it
//   7004: 200, "partial", then destroy(): RST_STREAM(INTERNAL_ERROR) alone
//   7002: 503    7003: 401
//   else: 200 and echo, ending its side (END_STREAM) after the client's.
// It exits when its stdin closes.
'use strict';
const fs = require('fs');
const http2 = require('http2');

const cfg = JSON.parse(process.argv[2]);
const emit = (ev) => process.stdout.write(JSON.stringify(ev) + '\n');

const server = http2.createSecureServer({
  ca: fs.readFileSync(cfg.ca),
  cert: fs.readFileSync(cfg.cert),
  key: fs.readFileSync(cfg.key),
  requestCert: true, // mutual TLS: the client's certificate is mandatory
  rejectUnauthorized: true,
  minVersion: 'TLSv1.3',
  ALPNProtocols: ['h2'],
  allowHTTP1: false,
  settings: cfg.maxStreams ? { maxConcurrentStreams: cfg.maxStreams } : {},
});

let conns = 0;
server.on('secureConnection', (sock) => {
  conns++;
  emit({
    ev: 'conn',
    n: conns,
    alpn: sock.alpnProtocol,
    version: sock.getProtocol(),
    cipher: sock.getCipher().name,
    sni: sock.servername || '',
    peerSAN: sock.getPeerCertificate().subjectaltname || '',
  });
});

server.on('stream', (stream, headers) => {
  const authority = headers[':authority'];
  const plain = {};
  for (const [k, v] of Object.entries(headers)) plain[k] = String(v);
  emit({ ev: 'stream', authority, method: headers[':method'], headers: plain });
  stream.on('close', () => emit({ ev: 'close', authority, rstCode: stream.rstCode }));
  stream.on('error', () => {}); // a reset by the client is reported by 'close'
  if (headers[':method'] !== 'CONNECT') {
    stream.respond({ ':status': 400 }, { endStream: true });
    return;
  }
  const port = authority.slice(authority.lastIndexOf(':') + 1);
  switch (port) {
    case '7001':
      stream.respond({ ':status': 200 });
      stream.write('partial', () => stream.close(http2.constants.NGHTTP2_CONNECT_ERROR));
      return;
    case '7004':
      stream.respond({ ':status': 200 });
      stream.write('partial', () => stream.destroy(new Error('target reset')));
      return;
    case '7002':
      stream.respond({ ':status': 503 }, { endStream: true });
      return;
    case '7003':
      stream.respond({ ':status': 401 }, { endStream: true });
      return;
  }
  stream.respond({ ':status': 200 });
  stream.on('data', (chunk) => stream.write(chunk));
  stream.on('end', () => stream.end());
});

server.listen(0, '127.0.0.1', () => emit({ ev: 'listening', port: server.address().port }));
process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
