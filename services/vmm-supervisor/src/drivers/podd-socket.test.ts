import { lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, symlinkSync, writeFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { bindPoddSocket, preparePoddDirs } from './podd-socket';
import { useTempDir } from '@sandnode/testkit';

function connect(p: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const c = net.connect(p, () => resolve(c));
    c.once('error', reject);
  });
}

describe('podd socket', () => {
  const tmp = useTempDir('podd-sock');
  test('preparePoddDirs makes guest/ a real dir (a planted symlink is replaced) and drops stale temp names', () => {
    const dir = tmp();
    symlinkSync('/etc', path.join(dir, 'guest'));
    writeFileSync(path.join(dir, '.p0123abc'), '');
    writeFileSync(path.join(dir, '.keep'), '');
    const guest = preparePoddDirs(dir);
    expect(guest).toBe(path.join(dir, 'guest'));
    expect(lstatSync(guest).isDirectory()).toBe(true);
    expect(readdirSync(dir).sort()).toEqual(['.keep', 'guest']);
  });

  test('preparePoddDirs with a guest mount makes guest/ a symlink to it; a dir an older VM left there (with a planted symlink) is removed, not followed', () => {
    const root = tmp();
    const [dir, outside, mountDir] = ['podd', 'outside', 'tmpfs-guest'].map((d) => path.join(root, d)) as [string, string, string];
    for (const d of [dir, outside, mountDir]) mkdirSync(d);
    writeFileSync(path.join(outside, 'victim'), 'host file');
    mkdirSync(path.join(dir, 'guest'));
    symlinkSync(outside, path.join(dir, 'guest', 'evil'));
    expect(preparePoddDirs(dir, mountDir)).toBe(mountDir);
    expect(readlinkSync(path.join(dir, 'guest'))).toBe(mountDir);
    expect(readFileSync(path.join(outside, 'victim'), 'utf8')).toBe('host file');
  });

  test('bind -> publish: podd.sock is a 0600 socket whose listener is the handed-out fd; our copy closed, temp name gone', async () => {
    const dir = tmp();
    writeFileSync(path.join(dir, 'podd.sock'), 'stale');
    const s = await bindPoddSocket(dir);
    expect(s.fd).toBeGreaterThan(2);
    // The VM holds the listening socket as its fd 3 (here: a sleep that inherited it).
    const holder = spawn('sleep', ['30'], { stdio: ['ignore', 'ignore', 'ignore', s.fd] });
    await new Promise((resolve) => holder.once('spawn', resolve));
    s.publish();
    const st = lstatSync(s.path);
    expect(st.isSocket()).toBe(true);
    expect(st.mode & 0o777).toBe(0o600);
    expect(readdirSync(dir)).toEqual(['podd.sock']);
    // connect() completes into the backlog of the socket only the holder has open now.
    const c = await connect(s.path);
    c.destroy();
    holder.kill('SIGKILL');
    await new Promise((resolve) => holder.once('exit', resolve));
    await expect(connect(s.path)).rejects.toThrow(/ECONNREFUSED/);
  });

  test('discard closes the socket and leaves no name behind', async () => {
    const dir = tmp();
    const s = await bindPoddSocket(dir);
    s.discard();
    expect(readdirSync(dir)).toEqual([]);
  });
});
