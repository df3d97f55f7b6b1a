import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { makeLayout } from './network-layout';
import { purgeNodeNetwork, writeNetworkTagFile } from './network-purge';

const hasNft = spawnSync('nft', ['--version']).status === 0;
const suite = hasNft || process.env.CI === 'true' ? describe : describe.skip;

suite('purgeNodeNetwork (nftables)', () => {
  test('finds the node by the tag its supervisor recorded, not by the one it is given (a custom networkTag)', () => {
    const runDir = mkdtempSync(path.join(tmpdir(), 'sn-purge-'));
    const tag = `q${Math.floor(Math.random() * 1000)}`;
    try {
      writeNetworkTagFile(makeLayout('10.209.0.0/16', tag, runDir));
      execFileSync('nft', ['add', 'table', 'inet', `sandnode-${tag}`]);
      const r = purgeNodeNetwork({ tag: 'zzzz', runDir });
      expect(r.table).toBe(true);
      expect(spawnSync('nft', ['list', 'table', 'inet', `sandnode-${tag}`]).status).not.toBe(0);
    } finally {
      spawnSync('nft', ['delete', 'table', 'inet', `sandnode-${tag}`]);
      rmSync(runDir, { recursive: true, force: true });
    }
  });
});
