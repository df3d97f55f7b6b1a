import net from 'node:net';
import { linkSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { failuresIn, holderOf, LISTENER_FAILURE_MSG, listenerFailures, listeningSockets, nodeOpens, procAddress, unixPathNow } from './listening';

describe('listening sockets from /proc', () => {
  it('decodes /proc/net addresses (IPv4 and IPv6)', () => {
    expect(procAddress('0100007F:2124')).toBe('127.0.0.1:8484');
    expect(procAddress('00000000000000000000000001000000:0050')).toBe('[::1]:80');
  });

  it("finds this process's TCP and unix listeners and who holds a port", async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'listening-'));
    const tcp = net.createServer();
    const unix = net.createServer();
    try {
      await new Promise<void>((r) => tcp.listen(0, '127.0.0.1', r));
      await new Promise<void>((r) => unix.listen(path.join(dir, 's.sock'), r));
      const port = (tcp.address() as net.AddressInfo).port;
      const got = listeningSockets(process.pid);
      expect(got).toContain(`tcp 127.0.0.1:${port}`);
      expect(got).toContain(`unix ${path.join(dir, 's.sock')}`);
      expect(holderOf(`127.0.0.1:${port}`)).toMatch(new RegExp(`^pid ${process.pid}\\b`));
      // named by its command line, not Node 24's thread name (newcomer: "pid 16155 (MainThread)")
      expect(holderOf(`127.0.0.1:${port}`)).not.toContain('(MainThread)');
      expect(holderOf(`127.0.0.1:${port}`)).toContain(process.argv[1]!.split('/').pop()!);
    } finally {
      tcp.close();
      unix.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('shows a unix socket bound to a temporary name and then linked to its path by that path (how the server binds)', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'listening-'));
    const sock = path.join(dir, 'server.sock');
    const tmp = `${sock}.${process.pid}.tmp`;
    const unix = net.createServer();
    try {
      await new Promise<void>((r) => unix.listen(tmp, r));
      linkSync(tmp, sock);
      rmSync(tmp);
      const got = listeningSockets(process.pid);
      expect(got).toContain(`unix ${sock}`);
      expect(got).not.toContain(`unix ${tmp}`);
      // a temporary name that is still there, or one whose path is no socket, is shown as bound
      writeFileSync(tmp, '');
      expect(unixPathNow(tmp)).toBe(tmp);
      const other = path.join(dir, 'file');
      writeFileSync(other, '');
      expect(unixPathNow(`${other}.1.tmp`)).toBe(`${other}.1.tmp`);
      expect(unixPathNow(path.join(dir, 'plain.sock'))).toBe(path.join(dir, 'plain.sock'));
    } finally {
      unix.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a pid that does not exist listens on nothing', () => {
    expect(listeningSockets(2 ** 22 + 17)).toEqual([]);
  });
});

describe('listener failures in the server log', () => {
  const line = (pid: number, extra: object) => JSON.stringify({ level: 'error', time: new Date().toISOString(), pid, msg: LISTENER_FAILURE_MSG, ...extra });

  it('reads listener, address and error code; other lines and non-JSON are skipped', () => {
    expect(failuresIn([line(1, { listener: 'ingress', address: '127.0.0.1:8480', err: { code: 'EADDRINUSE' } }), 'garbage ' + LISTENER_FAILURE_MSG, '{"msg":"active"}'])).toEqual([
      { listener: 'ingress', address: '127.0.0.1:8480', error: 'EADDRINUSE' },
    ]);
  });

  it("counts only the given pid's lines (an earlier server in the same file is not this one)", async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'listening-log-'));
    try {
      const f = path.join(dir, 'server.log');
      writeFileSync(
        f,
        [
          line(11, { listener: 'dns-udp', address: 'x', err: { code: 'EACCES' } }),
          line(22, { listener: 'ingress', address: 'y', err: { message: 'boom' } }),
          JSON.stringify({ pid: 22, msg: 'active' }),
        ].join('\n') + '\n',
      );
      expect(await listenerFailures(22, 2000, f)).toEqual([{ listener: 'ingress', address: 'y', error: 'boom' }]);
      // no "active" line of pid 33: gives up after the wait with what it found
      expect(await listenerFailures(33, 200, f)).toEqual([]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// `up`'s OPENS column: a freeze port per VM (warm pool members too) is counted, not listed
describe('nodeOpens', () => {
  it('keeps the node sockets and counts the per-sandbox freeze sockets in one entry', () => {
    const vms = '/var/lib/sandnode/run/vmm/vms';
    const got = nodeOpens(['tcp 127.0.0.1:9102', `unix ${vms}/vm-a/freeze-port/freeze.sock`, 'unix /var/lib/sandnode/run/vmm.sock', `unix ${vms}/vm-b/freeze-port/freeze.sock`]);
    expect(got).toEqual(['tcp 127.0.0.1:9102', 'unix /var/lib/sandnode/run/vmm.sock', `unix ${vms}/<id>/freeze-port/freeze.sock (one per sandbox: 2)`]);
    expect(nodeOpens(['unix /run/x/freeze.sock'])).toEqual(['unix /run/x/freeze.sock']);
  });
});
