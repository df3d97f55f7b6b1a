import { chownSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createServer } from 'nice-grpc';
import { AdminServiceDefinition, ServerRole, type AdminServiceImplementation } from '@sandnode/shared/proto/server/v1/admin';
import { adminSockets, findActiveServer } from './lease';

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

describe('findActiveServer', () => {
  let dir: string;
  const servers: Array<{ shutdown(): Promise<void> }> = [];
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-active-'));
  });
  afterEach(async () => {
    await Promise.all(servers.splice(0).map((s) => s.shutdown()));
    rmSync(dir, { recursive: true, force: true });
  });
  /** an admin socket that answers GetLeaseStatus with role and epoch */
  async function admin(name: string, role: ServerRole, epoch: number) {
    const server = createServer();
    const impl: Record<string, unknown> = {};
    for (const m of Object.keys(AdminServiceDefinition.methods)) impl[m] = () => Promise.reject(new Error('not in this test'));
    impl.getLeaseStatus = async () => ({ role, epoch, holderPid: 4242, slot: '', version: 'x', sinceMs: 0 });
    server.add(AdminServiceDefinition, impl as unknown as AdminServiceImplementation);
    await server.listen(`unix://${path.join(dir, name)}`);
    servers.push(server);
  }

  it('names the one ACTIVE server and ignores standbys', async () => {
    await admin('server-a-admin.sock', ServerRole.SERVER_ROLE_ACTIVE, 3);
    await admin('server-b-admin.sock', ServerRole.SERVER_ROLE_STANDBY, 3);
    expect(await findActiveServer(dir)).toMatchObject({ role: 'ACTIVE', epoch: 3, admin: `unix://${path.join(dir, 'server-a-admin.sock')}` });
  });

  it('refuses to pick when two answer ACTIVE (one of them lies)', async () => {
    await admin('server-a-admin.sock', ServerRole.SERVER_ROLE_ACTIVE, 3);
    await admin('server-1-admin.sock', ServerRole.SERVER_ROLE_ACTIVE, 999);
    await expect(findActiveServer(dir)).rejects.toThrow(/2 admin sockets answer ACTIVE .*refusing to pick one/);
  });
});
