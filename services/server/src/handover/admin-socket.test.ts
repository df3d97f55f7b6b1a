import { linkSync, renameSync, rmSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { bindAdminSocket, checkAdminSocket, type AdminSocketBinding } from './admin-socket';

/** the first bytes a client of unix socket p reads */
function greeting(p: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = net.connect(p);
    c.once('data', (d) => {
      c.destroy();
      resolve(d.toString());
    });
    c.once('error', reject);
  });
}

describe('checkAdminSocket: the admin socket path stays the way to this server', () => {
  const tempDir = useTempDir('admin-socket');
  const servers: net.Server[] = [];
  const serve = (word: string) => (s: net.Server) => {
    servers.push(s);
    s.on('connection', (c) => c.on('error', () => undefined).end(word));
  };
  let bound: AdminSocketBinding;
  let p: string;
  beforeEach(async () => {
    p = path.join(tempDir(), 'server-a-admin.sock');
    bound = await bindAdminSocket(`unix://${p}`, serve('first'));
  });
  afterEach(async () => {
    await Promise.all(servers.splice(0).map((s) => new Promise((r) => (s.listening ? s.close(r) : r(undefined)))));
  });

  it('leaves its own socket alone', async () => {
    const r = await checkAdminSocket(bound, serve('second'));
    expect(r).toEqual({ state: 'ours', bound });
    expect(await greeting(p)).toBe('first');
  });

  it('binds the path again when it was removed (a tmp cleaner), and closes the old listener', async () => {
    rmSync(p);
    const r = await checkAdminSocket(bound, serve('second'));
    expect(r.state).toBe('rebound');
    expect(await greeting(p)).toBe('second');
    expect(bound.listener.server.listening).toBe(false);
  });

  it('binds the path again over a dead socket', async () => {
    rmSync(p);
    const dead = net.createServer();
    await new Promise<void>((r) => dead.listen(p, () => r()));
    // a socket no one listens on any more: closing unlinks it, so keep the name by a hard link first
    const keep = `${p}.keep`;
    linkSync(p, keep);
    await new Promise((r) => dead.close(r));
    renameSync(keep, p);
    const r = await checkAdminSocket(bound, serve('second'));
    expect(r.state).toBe('rebound');
    expect(await greeting(p)).toBe('second');
  });

  it('leaves a live socket of another process at the path alone', async () => {
    rmSync(p);
    const other = net.createServer((c) => c.on('error', () => undefined).end('other'));
    servers.push(other);
    await new Promise<void>((r) => other.listen(p, () => r()));
    const r = await checkAdminSocket(bound, serve('second'));
    expect(r).toEqual({ state: 'foreign', bound });
    expect(await greeting(p)).toBe('other');
  });
});
