/** Whose config a compat daemon gets, and what each build's config file holds (node-config.ts). */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from './main';
import { NODE_SETTINGS, slotWriter, v1KeysOf, writeNodeConfig, writerOf } from './node-config';
import { REPO_ROOT } from './releases';
import type { Build } from './types';

const n: Build = { label: 'N', version: '0.3.0-dev', commit: 'x', dir: REPO_ROOT };
let root = '';
let old: Build;
beforeAll(() => {
  root = mkdtempSync(path.join(os.tmpdir(), 'sandnode-node-config-'));
  // a build without a slot writer (0.2.0's layout: shared/ at the top, no writeConfigSlots)
  mkdirSync(path.join(root, 'old', 'shared', 'dist'), { recursive: true });
  old = { label: '0.2.0', version: '0.2.0', commit: 'y', dir: path.join(root, 'old') };
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('node configs', () => {
  it('swapped gives each build the other one of the pair, own its own', () => {
    expect(writerOf('swapped', n, [old, n]).label).toBe('0.2.0');
    expect(writerOf('swapped', old, [old, n]).label).toBe('N');
    expect(writerOf('own', old, [old, n]).label).toBe('0.2.0');
  });
  it('N writes both slots with its own writer; a build without one has a format-1 file of the keys it knows', () => {
    expect(slotWriter(n)).toBeDefined();
    expect(slotWriter(old)).toBeUndefined();
    for (const c of ['server', 'vmm-supervisor', 'ublk-manager'] as const) {
      const v1 = v1KeysOf(n, c);
      const newKeys = Object.keys(NODE_SETTINGS[c]).filter((k) => !v1.includes(k));
      expect(newKeys.length).toBeGreaterThan(0); // the file tests keys 0.2.0 does not know
      const byN = writeNodeConfig(path.join(root, 'a'), c, n, n);
      expect(Object.keys(JSON.parse(readFileSync(byN, 'utf8')) as object).filter((k) => k !== 'version' && !v1.includes(k))).toEqual([]);
      expect(JSON.parse(readFileSync(byN.replace(/\.json$/, '.v2.json'), 'utf8'))).toEqual({ version: 2, ...NODE_SETTINGS[c] });
      const byOld = writeNodeConfig(path.join(root, 'b'), c, old, n);
      expect(existsSync(byOld.replace(/\.json$/, '.v2.json'))).toBe(false);
      const body = JSON.parse(readFileSync(byOld, 'utf8')) as Record<string, unknown>;
      expect(body.version).toBe(1);
      for (const k of newKeys) expect(body).not.toHaveProperty(k);
    }
  });
  it('the command line picks the mode (swapped by default)', () => {
    expect(parseArgs([]).configs).toBe('swapped');
    expect(parseArgs(['--own-configs']).configs).toBe('own');
    expect(parseArgs(['--own-configs', '--swap-configs']).configs).toBe('swapped');
    expect(parseArgs(['--no-configs']).configs).toBeUndefined();
  });
});
