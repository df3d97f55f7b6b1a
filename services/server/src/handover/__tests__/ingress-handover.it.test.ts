/**
 * The ingress listener handed over between two processes with the handover's own parts (fd-pass
 * over SCM_RIGHTS, named-listeners.ts, the ingress): this jest process is the old server, a child
 * node process (services/server/dist) the new one. Fresh client connections run the whole time;
 * every one must be answered (by the old server, or by the new one after it accepts; between the
 * old server's close and the new one's listen they wait in the shared backlog). A WebSocket opened
 * on the old server goes on working after the old server stopped accepting: it is relayed by the
 * old process until that process exits (moving connections is the next issue).
 * Needs root (the sandbox netns) and `npx tsc -b services/server/tsconfig.build.json`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { rmSync, writeFileSync } from 'node:fs';
import { createLogger } from '@sandnode/shared';
import { built, describeWith, makeTempDir, PARTS } from '@sandnode/testkit';
import { MapNetworkDirectory, type SandboxNetworkView } from '../../core/network-directory';
import { createIngress, type Ingress } from '../../network/ingress';
import { startSandboxNetns, type SandboxNetns } from '../../network/__tests__/sandbox-netns';
import { sendFds } from '../fd-pass';
import { namedSpec, namedToSend, openNamedListeners, type HandoverFdMeta, type OwnedNamedListener } from '../named-listeners';

const DIST = path.resolve(__dirname, '../../../dist');
const SHARED = path.resolve(__dirname, '../../../../../packages/shared/dist/index.js');
const ID = 'sb-00000000000000bb';

/** The new server: receive the fds, attach the ingress, say "ready", accept only once told "accept". */
const CHILD_JS = (fdPath: string, view: SandboxNetworkView) => String.raw`
const { receiveFds } = require(${JSON.stringify(path.join(DIST, 'handover/fd-pass.js'))});
const { openNamedListeners, splitReceived, namedSpec } = require(${JSON.stringify(path.join(DIST, 'handover/named-listeners.js'))});
const { createIngress } = require(${JSON.stringify(path.join(DIST, 'network/ingress.js'))});
const { MapNetworkDirectory } = require(${JSON.stringify(path.join(DIST, 'core/network-directory.js'))});
const { createLogger } = require(${JSON.stringify(SHARED)});
const rx = receiveFds(${JSON.stringify(fdPath)}, 20000);
rx.ready.then(() => process.stdout.write('listening-fds\n'));
rx.message.then((msg) => {
  const { named } = splitReceived(msg.meta, msg.fds);
  const dir = new MapNetworkDirectory(); dir.set(${JSON.stringify(view)});
  const ingress = createIngress({ engine: 'node-http', directory: dir, domain: 'localhost', log: createLogger('server', 'test', 'silent') });
  ingress.server.prependListener('request', (req, res) => res.setHeader('x-served-by', 'new'));
  process.stdout.write('ready\n');
  process.stdin.once('data', async () => {
    const got = await openNamedListeners([namedSpec('ingress', '127.0.0.1:0')], named, () => ingress.server);
    process.stdout.write(got.opened.length === 1 && got.failed.length === 0 ? 'accepting\n' : 'failed ' + got.failed.map((f) => f.err.message) + '\n');
  });
});
`;

function lines(c: ChildProcess): (want: string) => Promise<void> {
  let buf = '';
  const waiters: { want: string; resolve: () => void }[] = [];
  c.stdout!.on('data', (d: Buffer) => {
    buf += d.toString();
    for (const w of [...waiters]) if (buf.includes(`${w.want}\n`)) w.resolve();
  });
  return (want) =>
    new Promise<void>((resolve, reject) => {
      if (buf.includes(`${want}\n`)) return resolve();
      waiters.push({ want, resolve });
      c.once('exit', (code) => reject(new Error(`the new server exited (${code}) before "${want}"; said: ${buf}`)));
    });
}

describeWith('ingress listener handover (two processes)', [PARTS.root, built('@sandnode/server')], () => {
  let sb: SandboxNetns & { dir: string };
  let tmp: string;
  let ingress: Ingress;
  let child: ChildProcess | undefined;

  beforeAll(async () => {
    sb = await startSandboxNetns();
    tmp = makeTempDir('ingress-handover');
  }, 30_000);
  afterAll(async () => {
    child?.kill('SIGKILL');
    await ingress?.close();
    sb?.stop();
    rmSync(tmp, { recursive: true, force: true });
  });

  test('fresh connections during the handover are all served; an open WebSocket keeps working on the old server', async () => {
    const view: SandboxNetworkView = {
      sandboxId: ID,
      state: 'RUNNING',
      slot: 0,
      address: sb.address,
      gateway: sb.gateway,
      policy: {} as SandboxNetworkView['policy'],
      public: true,
      accessTokenSha256: '',
      poddAddress: '',
    };
    const dir = new MapNetworkDirectory();
    dir.set(view);
    // node-http: the servers are told apart by a header set in its 'request' event; the listener
    // handover under test is the same for both engines (they only attach to the net.Server)
    ingress = createIngress({ engine: 'node-http', directory: dir, domain: 'localhost', log: createLogger('server', 'test', 'silent') });
    ingress.server.prependListener('request', (_req: http.IncomingMessage, res: http.ServerResponse) => res.setHeader('x-served-by', 'old'));
    const opened = await openNamedListeners([namedSpec('ingress', '127.0.0.1:0')], [], () => ingress.server);
    const named: OwnedNamedListener[] = opened.opened;
    const port = named[0]!.port;
    const host = (p: number) => `${p}-${ID}.localhost:${port}`;

    // a WebSocket through the old server, opened before the handover
    const ws = net.connect(port, '127.0.0.1');
    await new Promise<void>((r) => ws.once('connect', () => r()));
    const wsRead = (n: number) =>
      new Promise<string>((resolve) => {
        let s = '';
        const on = (d: Buffer) => {
          s += d.toString('latin1');
          if (s.length >= n) {
            ws.off('data', on);
            resolve(s);
          }
        };
        ws.on('data', on);
      });
    const head = wsRead(10);
    ws.write(`GET / HTTP/1.1\r\nHost: ${host(8081)}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`);
    expect(await head).toMatch(/^HTTP\/1\.1 101/);
    const frame = (t: string) => {
      const p = Buffer.from(t);
      return Buffer.concat([Buffer.from([0x81, 0x80 | p.length, 0, 0, 0, 0]), p]); // zero mask
    };
    await new Promise((r) => setTimeout(r, 50)); // the rest of the 101 head
    ws.removeAllListeners('data');
    const echo1 = wsRead(2 + 6);
    ws.write(frame('before'));
    expect((await echo1).slice(2)).toBe('before');

    // fresh connections, one after another (each its own TCP connection), all through the handover
    let stop = false;
    const served = { old: 0, new: 0, failed: 0 };
    const errors: string[] = [];
    const load = (async () => {
      while (!stop) {
        await new Promise<void>((resolve) => {
          const req = http.request({ host: '127.0.0.1', port, path: '/echo', headers: { host: host(8080) }, agent: false }, (res) => {
            res.resume();
            res.on('end', () => {
              if (res.statusCode === 200) served[res.headers['x-served-by'] === 'new' ? 'new' : 'old']++;
              else served.failed++;
              resolve();
            });
          });
          req.on('error', (e) => {
            served.failed++;
            errors.push(e.message);
            resolve();
          });
          req.end();
        });
      }
    })();

    try {
      const fdPath = path.join(tmp, 'fds.sock');
      writeFileSync(path.join(tmp, 'child.js'), CHILD_JS(fdPath, view));
      child = spawn(process.execPath, [path.join(tmp, 'child.js')], { stdio: ['pipe', 'pipe', 'inherit'], cwd: path.resolve(__dirname, '../../..') });
      const said = lines(child);
      await said('listening-fds');
      while (served.old < 20) await new Promise((r) => setTimeout(r, 10));
      // the old server's side: the named listeners the standby knows, after the gRPC ones (none here)
      const send = namedToSend(named, ['server.ingress.v1']);
      const meta: HandoverFdMeta = { listeners: [], named: send.map((l) => ({ name: l.name, kind: l.kind, address: l.address })) };
      await sendFds(
        fdPath,
        meta,
        send.map((l) => l.fd),
      );
      await said('ready');
      // FinishHandover: the old server stops accepting, then the new one accepts
      for (const l of named) l.close();
      child.stdin!.write('accept\n');
      await said('accepting');
      const atSwitch = served.new;
      while (served.new < atSwitch + 20) await new Promise((r) => setTimeout(r, 10));
    } finally {
      stop = true;
      await load;
    }

    expect(errors).toEqual([]);
    expect(served.failed).toBe(0);
    expect(served.old).toBeGreaterThanOrEqual(20);
    expect(served.new).toBeGreaterThanOrEqual(20);
    // the WebSocket still works: the old process relays it (until it exits)
    const echo2 = wsRead(2 + 5);
    ws.write(frame('after'));
    expect((await echo2).slice(2)).toBe('after');
    ws.destroy();
    process.stdout.write(`ingress handover: fresh connections served old=${served.old} new=${served.new} failed=${served.failed}\n`);
  }, 60_000);
});
