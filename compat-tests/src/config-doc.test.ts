/** docs/config.md lists every key of every component as the built schemas have it (config-doc.ts). */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { CONFIG_COMPONENTS, readmeMeanings, renderConfigDoc } from './config-doc';
import { REPO_ROOT } from './releases';

describe('docs/config.md', () => {
  it('is what the schemas, KEY_SINCE and the READMEs say (regenerate: node compat-tests/dist/config-doc.js)', () => {
    expect(readFileSync(path.join(REPO_ROOT, 'docs', 'config.md'), 'utf8')).toBe(renderConfigDoc());
  });

  it('has a row for every key of every schema, each with a meaning from its README', () => {
    const doc = renderConfigDoc();
    for (const c of CONFIG_COMPONENTS) {
      const m = require(path.join(REPO_ROOT, 'services', c, 'dist', 'config.js')) as Record<string, { shape?: Record<string, unknown> } | undefined>;
      const keys = Object.keys((m.configSchema ?? m.poddConfigSchema)?.shape ?? {});
      expect(keys.length).toBeGreaterThan(5);
      const section = doc.slice(doc.indexOf(`## ${c}\n`)).split('\n## ')[0]!;
      for (const k of keys) expect(section).toContain(`| \`${k}\` |`);
    }
  });

  it('reads the meaning column of a README key table, with or without an env column', () => {
    const m = readmeMeanings('x\n| key | env | default | meaning |\n|---|---|---|---|\n| `a` | `E` | `1` | the a \\| b |\n\n| key | default | meaning |\n|---|---|---|\n| b / c | 2 | bee |\n');
    expect([...m]).toEqual([
      ['a', 'the a \\| b'],
      ['b', 'bee'],
      ['c', 'bee'],
    ]);
  });
});
