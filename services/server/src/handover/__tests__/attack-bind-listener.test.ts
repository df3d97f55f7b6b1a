/**
 * Adversarial finding (issue 11, stale / planted admin sockets in the run dir): bindListener
 * tests its path with existsSync (which follows symlinks), so a dangling symlink at
 * `server-<slot>-admin.sock` (or at server.sock) is neither removed nor replaced: linkSync fails
 * EEXIST, the standby exits 1, and its `<path>.<pid>.tmp` socket stays behind. Seen on a real
 * node: every `sandnode upgrade server` into that slot failed, each one leaving one more
 * `server-b-admin.sock.<pid>.tmp`. A directory there fails the same way (EISDIR), also leaking.
 * The name of a dead server's leftover must be taken over (it is not a socket anyone serves),
 * and a failed bind must leave no temp socket.
 */
import { mkdirSync, readdirSync, symlinkSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { useTempDir } from '@sandnode/testkit';
import { bindListener } from '../listeners';

describe('bindListener on a path a dead server or an operator left behind', () => {
  const tempDir = useTempDir('attack-bind');
  // a failed bind leaks its listening server today; close every server made so jest can exit
  const made: net.Server[] = [];
  const create = net.createServer.bind(net);
  beforeEach(() => {
    jest.spyOn(net, 'createServer').mockImplementation(((...args: Parameters<typeof net.createServer>) => {
      const s = create(...args);
      made.push(s);
      return s;
    }) as typeof net.createServer);
  });
  afterEach(async () => {
    jest.restoreAllMocks();
    await Promise.all(made.splice(0).map((s) => new Promise((r) => s.close(r))));
  });

  it('takes over a dangling symlink', async () => {
    const p = path.join(tempDir(), 'server-b-admin.sock');
    symlinkSync('/nonexistent/dangling', p);
    await bindListener(`unix://${p}`);
    expect(readdirSync(tempDir())).toEqual(['server-b-admin.sock']);
  });

  it('fails on a directory without leaving its temp socket', async () => {
    const p = path.join(tempDir(), 'server-a-admin.sock');
    mkdirSync(p);
    await expect(bindListener(`unix://${p}`)).rejects.toThrow();
    expect(readdirSync(tempDir())).toEqual(['server-a-admin.sock']);
    expect(made.filter((s) => s.listening)).toHaveLength(0);
  });
});
