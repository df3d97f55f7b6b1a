import { chownSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { adminSockets } from './lease';

describe('adminSockets', () => {
  let dir: string;
  const servers: net.Server[] = [];
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-lease-'));
  });
  afterEach(async () => {
    await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
    rmSync(dir, { recursive: true, force: true });
  });
  const listen = (name: string) =>
    new Promise<void>((resolve) => {
      const s = net.createServer();
      servers.push(s);
      s.listen(path.join(dir, name), () => resolve());
    });

  it('lists only admin sockets of root or this user, never files, symlinks or other names', async () => {
    await listen('server-a-admin.sock');
    await listen('server-4242-admin.sock');
    await listen('server.sock');
    writeFileSync(path.join(dir, 'server-b-admin.sock'), 'not a socket');
    symlinkSync(path.join(dir, 'server-a-admin.sock'), path.join(dir, 'server-c-admin.sock'));
    expect(
      adminSockets(dir)
        .map((p) => path.basename(p))
        .sort(),
    ).toEqual(['server-4242-admin.sock', 'server-a-admin.sock']);
  });

  it('ignores a socket another (non-root) user owns', async () => {
    if (process.getuid?.() !== 0) return; // chown needs root; the rule itself is uid-based
    await listen('server-a-admin.sock');
    chownSync(path.join(dir, 'server-a-admin.sock'), 65534, 65534);
    expect(adminSockets(dir)).toEqual([]);
  });

  it('is empty for a missing dir', () => {
    expect(adminSockets(path.join(dir, 'nope'))).toEqual([]);
  });
});
