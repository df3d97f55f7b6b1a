/** Integration: NftSession against the real nft (root), on a table of its own that it removes. */
import { execFileSync } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { createLogger } from '@sandnode/shared';
import { describeWith } from '@sandnode/testkit';
import { NET_PARTS } from '../__tests__/net-fixture';
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
