#!/usr/bin/env node
/**
 * A fake `firecracker` for unit tests of the firecracker driver: serves a tiny subset of the
 * Firecracker API (HTTP/1.1) on --api-sock and appends every request as a JSON line
 * {id, method, path, body} to $FAKE_FC_LOG. State: "Not started" -> InstanceStart -> "Running"
 * <-> PATCH /vm Paused/Resumed. SendCtrlAltDel exits (unless $FAKE_FC_IGNORE_CAD=1).
 * $FAKE_FC_FAIL_PATH makes PUTs of that path fail with 400.
 */
'use strict';
const http = require('node:http');
const fs = require('node:fs');

const args = process.argv.slice(2);
if (args.includes('--version')) {
  process.stdout.write('Firecracker v1.7.0\n');
  process.exit(0);
}
const sock = args[args.indexOf('--api-sock') + 1];
const id = args[args.indexOf('--id') + 1];
let state = 'Not started';
const log = (entry) => {
  if (process.env.FAKE_FC_LOG) fs.appendFileSync(process.env.FAKE_FC_LOG, `${JSON.stringify({ id, ...entry })}\n`);
};
const server = http.createServer((req, res) => {
  let text = '';
  req.on('data', (c) => (text += c));
  req.on('end', () => {
    const body = text ? JSON.parse(text) : undefined;
    log({ method: req.method, path: req.url, body, contentType: req.headers['content-type'] });
    const reply = (status, obj) => {
      res.writeHead(status, obj ? { 'Content-Type': 'application/json' } : {});
      res.end(obj ? JSON.stringify(obj) : undefined);
    };
    if (req.method === 'GET' && req.url === '/') return reply(200, { id, state, vmm_version: '1.7.0', app_name: 'Firecracker' });
    if (req.method === 'PUT' && req.url === process.env.FAKE_FC_FAIL_PATH) return reply(400, { fault_message: `injected failure of ${req.url}` });
    if (req.method === 'PUT' && req.url === '/actions') {
      if (body.action_type === 'InstanceStart') {
        state = 'Running';
        return reply(204);
      }
      if (body.action_type === 'SendCtrlAltDel') {
        reply(204);
        if (process.env.FAKE_FC_IGNORE_CAD !== '1') setTimeout(() => process.exit(0), 50);
        return;
      }
    }
    if (req.method === 'PATCH' && req.url === '/vm') {
      if (state === 'Not started') return reply(400, { fault_message: 'not started' });
      state = body.state === 'Paused' ? 'Paused' : 'Running';
      return reply(204);
    }
    if (req.method === 'PUT' && state !== 'Not started') return reply(400, { fault_message: 'the update operation is not allowed after boot' });
    if (req.method === 'PUT') return reply(204);
    reply(400, { fault_message: `unknown ${req.method} ${req.url}` });
  });
});
server.listen(sock);
process.on('SIGTERM', () => undefined); // like a VMM: only SIGKILL or a guest shutdown ends it
