/**
 * Config that rolls back (docs/config.md), against the real 0.2.0 build (built from git by
 * releases.ts): a config N writes (both slots) is read by 0.2.0's own loader and schemas, and
 * by a 0.2.0 ublk-manager process that starts with it; a config as 0.2.0's operator wrote it
 * (format 1) is read by N; N's V1_KEYS are exactly the keys 0.2.0 knows. Skips naming what is
 * missing (root, runc, busybox-static, loop devices, e2fsprogs, a built tree, the release
 * build); fails instead under CI=true.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig, type ConfigNote, type z } from '@sandnode/shared';
import { describeWith } from '@sandnode/testkit';
import { sharedDirRel } from './layout';
import { TempNode } from './node';
import { NODE_SETTINGS, v1KeysOf, writeNodeConfig } from './node-config';
import { COMPAT_PARTS, compatBuilds } from './prereq';
import type { Build } from './types';

jest.setTimeout(5 * 60_000);

const pre = compatBuilds('latest');
const DAEMONS = ['vmm-supervisor', 'ublk-manager', 'server'] as const;
type Schema = z.ZodObject<z.ZodRawShape>;

/** schemaOf is the config schema a build's daemon exports (0.2.0 named the server's serverConfigSchema). */
function schemaOf(b: Build, c: (typeof DAEMONS)[number]): Schema {
  const m = require(path.join(b.dir, 'services', c, 'dist', 'config.js')) as Record<string, Schema | undefined>;
  const s = m.configSchema ?? m.serverConfigSchema;
  if (!s) throw new Error(`${b.label} ${c}: no config schema export`);
  return s;
}

/** loaderOf is the build's own loadConfig (its common package). */
function loaderOf(b: Build): (schema: Schema, opts: { service: string; file?: string; env?: NodeJS.ProcessEnv }) => Record<string, unknown> {
  return (require(path.join(b.dir, sharedDirRel(b.dir), 'dist', 'config.js')) as { loadConfig: (s: Schema, o: object) => Record<string, unknown> }).loadConfig;
}

describeWith(
  'config rollback: 0.2.0 reads the config N writes, N reads 0.2.0s',
  COMPAT_PARTS,
  () => {
    const older = pre.older as Build;
    const n = pre.n as Build;
    let root = '';
    beforeAll(() => (root = mkdtempSync(path.join(os.tmpdir(), 'sandnode-config-rollback-'))));
    afterAll(() => rmSync(root, { recursive: true, force: true }));

    it.each(DAEMONS)("N's V1_KEYS of %s are exactly the keys of 0.2.0's schema", (c) => {
      expect([...v1KeysOf(n, c)].sort()).toEqual(Object.keys(schemaOf(older, c).shape).sort());
    });

    it.each(DAEMONS)("0.2.0's loader reads the config N writes for %s (its v1 slot), every key it knows set from it", (c) => {
      const file = writeNodeConfig(path.join(root, 'n-writes'), c, n, n);
      const got = loaderOf(older)(schemaOf(older, c), { service: c, file, env: {} });
      const known = Object.keys(schemaOf(older, c).shape);
      const expected = Object.fromEntries(Object.entries(NODE_SETTINGS[c]).filter(([k]) => known.includes(k)));
      expect(Object.keys(expected).length).toBeGreaterThan(0);
      expect(got).toMatchObject(expected);
      // the v2 slot beside it holds the keys 0.2.0 does not know, which N reads
      const v2 = JSON.parse(readFileSync(file.replace(/\.json$/, '.v2.json'), 'utf8')) as Record<string, unknown>;
      expect(v2).toEqual({ version: 2, ...NODE_SETTINGS[c] });
      const notes: ConfigNote[] = [];
      expect(loadConfig(schemaOf(n, c), { service: c, file, env: {}, notes })).toMatchObject(NODE_SETTINGS[c]);
      expect(notes).toEqual([]);
    });

    it.each(DAEMONS)('N reads a format-1 %s config as 0.2.0 has it (no slots), with the defaults for its newer keys', (c) => {
      const file = writeNodeConfig(path.join(root, 'old-writes'), c, older, n);
      expect(JSON.parse(readFileSync(file, 'utf8'))).toHaveProperty('version', 1);
      const notes: ConfigNote[] = [];
      const got = loadConfig(schemaOf(n, c), { service: c, file, env: {}, notes });
      const defaults = schemaOf(n, c).parse({}) as Record<string, unknown>;
      for (const [k, v] of Object.entries(NODE_SETTINGS[c])) expect([k, got[k]]).toEqual([k, v1KeysOf(n, c).includes(k) ? v : defaults[k]]);
      expect(notes).toEqual([]);
    });

    it("a 0.2.0 ublk-manager process starts with N's config and runs with its values", async () => {
      const node = new TempNode(n, 'sandnode-config-rollback-', { mode: 'swapped', pair: [older, n] });
      try {
        const pid = await node.start('ublk-manager', older);
        expect(node.configOf['ublk-manager']).toBe('N');
        expect((await node.version('ublk-manager')).version).toBe(older.version);
        // 0.2.0 logs the config it runs with at its start
        const log = readFileSync(path.join(node.dirs.runDir, 'logs', 'ublk-manager.log'), 'utf8');
        const starting = log
          .split('\n')
          .filter((l) => l.includes('"starting"') && l.includes(`"pid":${pid}`))
          .map((l) => JSON.parse(l) as { config?: Record<string, unknown> });
        expect(starting[0]?.config).toMatchObject({ drainMs: NODE_SETTINGS['ublk-manager'].drainMs, logLevel: 'info' });
      } finally {
        await node.down();
      }
    });
  },
  pre.missing,
);
