/**
 * The servers of the test internet, as the source of one node process started inside its netns
 * (`ip netns exec <ns> node -e CHILD_SOURCE`). Env: TI_ADDR (listen address), TI_CERT/TI_KEY
 * (PEM files), TI_RECORDS (JSON name → IPv4), TI_DNS_PACKET (path of the dns-packet module).
 * Prints "ready" on stdout once every server listens; exits when stdin closes (its parent died).
 */
export const CHILD_SOURCE = String.raw`
const http = require('node:http');
const https = require('node:https');
const net = require('node:net');
const dgram = require('node:dgram');
const fs = require('node:fs');
const dnsPacket = require(process.env.TI_DNS_PACKET);
const addr = process.env.TI_ADDR;
const records = JSON.parse(process.env.TI_RECORDS);
const chunk = Buffer.alloc(65536);
const echo = (req, res) => {
  const bytes = /^\/bytes\/(\d+)$/.exec(req.url);
  if (bytes) {
    let left = Number(bytes[1]);
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': left });
    const pump = () => {
      while (left > 0) {
        const n = Math.min(left, chunk.length);
        left -= n;
        if (!res.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return res.once('drain', pump);
      }
      res.end();
    };
    return pump();
  }
  const body = JSON.stringify({ method: req.method, path: req.url, host: req.headers.host ?? null, sni: req.socket.servername ?? null, remote: req.socket.remoteAddress });
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
};
const answer = (msg) => {
  let q;
  try { q = dnsPacket.decode(msg); } catch { return undefined; }
  const question = (q.questions || [])[0];
  if (!question) return undefined;
  const name = question.name.toLowerCase().replace(/\.$/, '');
  const a = records[name];
  const answers = a && question.type === 'A' ? [{ type: 'A', name: question.name, ttl: 5, data: a }] : [];
  return dnsPacket.encode({ type: 'response', id: q.id, flags: 0x0400 | 0x0100 | 0x0080 | (a ? 0 : 3), questions: q.questions, answers });
};
let pending = 4;
const up = () => { if (--pending === 0) process.stdout.write('ready\n'); };
http.createServer(echo).listen(80, addr, up);
https.createServer({ cert: fs.readFileSync(process.env.TI_CERT), key: fs.readFileSync(process.env.TI_KEY) }, echo).listen(443, addr, up);
net.createServer((s) => { s.on('error', () => s.destroy()); s.pipe(s); }).listen(7, addr, up);
const udp = dgram.createSocket('udp4');
udp.on('message', (msg, r) => { const b = answer(msg); if (b) udp.send(b, r.port, r.address); });
udp.bind(53, addr, () => {
  net.createServer((s) => {
    let buf = Buffer.alloc(0);
    s.on('error', () => s.destroy());
    s.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
        const m = buf.subarray(2, 2 + buf.readUInt16BE(0));
        buf = buf.subarray(2 + m.length);
        const b = answer(m);
        if (b) { const l = Buffer.alloc(2); l.writeUInt16BE(b.length); s.write(Buffer.concat([l, b])); }
      }
    });
  }).listen(53, addr, up);
});
process.stdin.on('end', () => process.exit(0));
process.stdin.on('close', () => process.exit(0));
process.stdin.resume();
`;
