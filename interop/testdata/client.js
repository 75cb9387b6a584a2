// An HBONE client written against Node's http2 module (nghttp2 + OpenSSL),
// independent of meshtun's own client. The Go test passes a JSON config
// as argv[2]; the script prints one JSON result line and exits 0, or
// prints the error and exits 1.
//
// config: {addr, ca, cert, key, serverID, streams: [{authority, size}],
//          speaker: {authority, size}, probes: [{method, authority}],
//          tls: {ciphers, alpn, minVersion, maxVersion}, headers: {name: value}}
// cert and key may be null: no client certificate. tls overrides the
// HBONE defaults, to break a rule on purpose. headers are added to every
// CONNECT (e.g. the baggage a ztunnel sends).
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const http2 = require('http2');
const tls = require('tls');

const cfg = JSON.parse(process.argv[2]);
const sha = (buf) => crypto.createHash('sha256').update(buf).digest('hex');

// Only TLS 1.3 with AES-GCM, ALPN h2, and the server is judged by its
// SPIFFE URI SAN, not by a host name (the peer is an IP: no SNI is sent).
const tlsOpts = cfg.tls || {};
const [host, port] = [cfg.addr.slice(0, cfg.addr.lastIndexOf(':')), Number(cfg.addr.slice(cfg.addr.lastIndexOf(':') + 1))];
// The TLS connection is made here (http2.connect would force its own ALPN
// list), then handed to the HTTP/2 session.
const session = http2.connect('https://' + cfg.addr, {
  createConnection: () => tls.connect({
    host,
    port,
    ca: fs.readFileSync(cfg.ca),
    cert: cfg.cert ? fs.readFileSync(cfg.cert) : undefined,
    key: cfg.key ? fs.readFileSync(cfg.key) : undefined,
    minVersion: tlsOpts.minVersion || 'TLSv1.3',
    maxVersion: tlsOpts.maxVersion || 'TLSv1.3',
    // Node names TLS 1.3 suites in "ciphers" too.
    ciphers: tlsOpts.ciphers || 'TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384',
    ALPNProtocols: tlsOpts.alpn || ['h2'],
    checkServerIdentity: (_host, cert) => {
      const uris = (cert.subjectaltname || '').split(', ');
      if (!uris.includes('URI:' + cfg.serverID)) {
        return new Error('server identity ' + cert.subjectaltname + ' is not ' + cfg.serverID);
      }
      return undefined;
    },
  }),
});

// connect opens a CONNECT stream and resolves with it once the answer's
// headers are in (any status).
function connect(authority, method) {
  const headers = { ...(cfg.headers || {}), ':method': method || 'CONNECT', ':authority': authority };
  if (method && method !== 'CONNECT') headers[':path'] = '/';
  const req = session.request(headers, { endStream: method && method !== 'CONNECT' });
  return new Promise((resolve, reject) => {
    req.once('response', (h) => resolve({ req, status: h[':status'] }));
    req.once('error', reject);
  });
}

// readAll collects a stream's DATA until END_STREAM.
function readAll(req) {
  const chunks = [];
  return new Promise((resolve, reject) => {
    req.on('data', (c) => chunks.push(c));
    req.once('end', () => resolve(Buffer.concat(chunks)));
    req.once('error', reject);
  });
}

// echo: send size random bytes, end our side (half-close), read the whole
// reply; the target echoes, so both hashes must match.
async function echo(s) {
  const { req, status } = await connect(s.authority);
  if (status !== 200) throw new Error('echo ' + s.authority + ': status ' + status);
  const data = crypto.randomBytes(s.size);
  const reply = readAll(req);
  req.end(data);
  const got = await reply;
  return { sent: sha(data), received: sha(got), bytes: got.length };
}

// speaker: the target talks first and FINs; only after our side saw
// END_STREAM do we send, then end. The mirror of echo's half-close.
async function speaker(s) {
  const { req, status } = await connect(s.authority);
  if (status !== 200) throw new Error('speaker: status ' + status);
  const got = await readAll(req);
  const data = crypto.randomBytes(s.size);
  await new Promise((resolve, reject) => {
    req.once('close', () => (req.rstCode === 0 ? resolve() : reject(new Error('rst ' + req.rstCode))));
    req.end(data);
  });
  return { received: sha(got), receivedBytes: got.length, sentAfterEnd: sha(data) };
}

async function main() {
  await new Promise((resolve, reject) => {
    session.once('connect', resolve);
    session.once('error', reject);
  });
  const sock = session.socket;
  const result = {
    alpn: session.alpnProtocol,
    version: sock.getProtocol(),
    cipher: sock.getCipher().name,
  };
  result.streams = await Promise.all((cfg.streams || []).map(echo));
  if (cfg.speaker) result.speaker = await speaker(cfg.speaker);
  result.probes = [];
  for (const p of cfg.probes || []) {
    const { req, status } = await connect(p.authority, p.method);
    req.close();
    result.probes.push({ method: p.method || 'CONNECT', authority: p.authority, status });
  }
  finished = true;
  session.close();
  process.stdout.write(JSON.stringify(result) + '\n');
}

// A refused handshake surfaces as a session error or as a session that
// closes (after the TLS 1.3 client already finished) before the work is
// done; both are failures.
let finished = false;
session.on('error', fail);
session.on('close', () => {
  if (!finished) fail(new Error('session closed before the work was done'));
});
function fail(err) {
  process.stdout.write(JSON.stringify({ error: String(err && err.message || err) }) + '\n');
  process.exit(1);
}
main().catch(fail);
