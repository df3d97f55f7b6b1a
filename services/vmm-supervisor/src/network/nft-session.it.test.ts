/** Integration: NftSession against the real nft (root), on a table of its own that it removes; purgeNodeNetwork on names of its own. */
import { execFileSync, spawnSync } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { createLogger, purgeNodeNetwork } from '@sandnode/shared';
import { describeWith } from '@sandnode/testkit';
import { NET_PARTS } from '../__tests__/net-fixture';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { NftSession } from './nft-session';

describeWith('NftSession (integration)', NET_PARTS, () => {
  const table = `sandnode-zs${randomInt(100)}`;
  const chain = () => execFileSync('nft', ['list', 'chain', 'inet', table, 'c']).toString();
  const s = new NftSession(table, createLogger('nft-session-test', '0', 'silent'));
  afterAll(() => {
    s.close();
    try {
      execFileSync('nft', ['delete', 'table', 'inet', table], { stdio: 'ignore' });
    } catch {
      /* not made */
    }
  });

  test('changes apply in order; a bad change throws naming nft error and changes nothing; a killed session is replaced', async () => {
    await s.apply(`table inet ${table} {\n  chain c {\n    accept\n  }\n}\n`);
    expect(chain()).toContain('accept');
    await expect(s.apply(`flush chain inet ${table} c\nadd rule inet ${table} c ip saddr 1.2.3.4 bogus\n`)).rejects.toThrow(/nft: Error: syntax error/);
    expect(chain()).toContain('accept'); // the flush of the failed change did not happen: one transaction
    const pids = execFileSync('pgrep', ['-P', String(process.pid), '-x', 'nft'])
      .toString()
      .trim()
      .split('\n');
    for (const pid of pids) process.kill(Number(pid), 'SIGKILL');
    await s.apply(`flush chain inet ${table} c\nadd rule inet ${table} c counter drop\n`);
    expect(chain()).toMatch(/counter packets \d+ bytes \d+ drop/);
    await Promise.all([1, 2, 3].map((i) => s.apply(`add rule inet ${table} c ip saddr 10.0.0.${i} accept\n`)));
    expect(chain().match(/ip saddr 10\.0\.0\.\d accept/g)).toEqual(['ip saddr 10.0.0.1 accept', 'ip saddr 10.0.0.2 accept', 'ip saddr 10.0.0.3 accept']);
  });
});

describeWith('purgeNodeNetwork (integration)', NET_PARTS, () => {
  test("removes the node's table, its sn<tag>v<n> ifaces, its netns mounts and DOCKER-USER rules, and nothing of another tag", () => {
    const tag = `zp${randomInt(10)}${randomInt(10)}`;
    const other = `zo${randomInt(10)}${randomInt(10)}`;
    const runDir = mkdtempSync(path.join(os.tmpdir(), 'purge-net-'));
    const ns = path.join(runDir, 'netns', '3');
    try {
      mkdirSync(path.dirname(ns), { recursive: true });
      writeFileSync(ns, '');
      execFileSync('unshare', [`--net=${ns}`, 'true']);
      execFileSync('ip', ['link', 'add', `sn${tag}v3`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
      execFileSync('ip', ['link', 'add', `sn${other}v1`, 'type', 'veth', 'peer', 'name', `sn${other}x1`]);
      execFileSync('nft', ['add', 'table', 'inet', `sandnode-${tag}`]);
      execFileSync('nft', ['add', 'table', 'inet', `sandnode-${other}`]);
      const docker = spawnSync('iptables', ['-w', '-S', 'DOCKER-USER']).status === 0;
      if (docker) execFileSync('iptables', ['-w', '-I', 'DOCKER-USER', '-i', `sn${tag}v+`, '-j', 'ACCEPT']);
      const r = purgeNodeNetwork({ tag, runDir });
      if (docker) expect(execFileSync('iptables', ['-w', '-S', 'DOCKER-USER']).toString()).not.toContain(`sn${tag}v+`);
      expect(r).toEqual({ table: true, ifaces: [`sn${tag}v3`], netns: [3] });
      const links = execFileSync('ip', ['-o', 'link']).toString();
      expect(links).not.toContain(`sn${tag}v3`);
      expect(links).toContain(`sn${other}v1`);
      expect(execFileSync('nft', ['list', 'tables']).toString()).toContain(`sandnode-${other}`);
      expect(execFileSync('nft', ['list', 'tables']).toString()).not.toContain(`sandnode-${tag}`);
      expect(purgeNodeNetwork({ tag, runDir })).toEqual({ table: false, ifaces: [], netns: [] });
    } finally {
      for (const [c, a] of [
        ['ip', ['link', 'del', `sn${other}v1`]],
        ['nft', ['delete', 'table', 'inet', `sandnode-${other}`]],
        ['umount', [ns]],
      ] as [string, string[]][]) {
        try {
          execFileSync(c, a, { stdio: 'ignore' });
        } catch {
          /* gone */
        }
      }
      rmSync(runDir, { recursive: true, force: true });
    }
  });
});
