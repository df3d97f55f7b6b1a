/**
 * docs/config.md is generated here from the built schemas of every component (key, default
 * from the schema itself, since-version from its KEY_SINCE, env variable) and the meaning
 * column of each service README's key table, below the hand-written part of the file (up to
 * {@link GENERATED_MARKER}): `node compat-tests/dist/config-doc.js` rewrites the part below,
 * and config-doc.test.ts fails while the file differs from what the schemas say (a key added
 * without its row, a default changed).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { envKey } from '@sandnode/shared';
import { REPO_ROOT } from './releases';

/** The line of docs/config.md below which the file is generated. */
export const GENERATED_MARKER = '<!-- generated below by compat-tests/src/config-doc.ts from the schemas: node compat-tests/dist/config-doc.js -->';

/** The components with a config, in the order of the document. */
export const CONFIG_COMPONENTS = ['server', 'vmm-supervisor', 'ublk-manager', 'podd'] as const;
/** The release line of this tree: the since-version of a key KEY_SINCE does not list. */
export const CURRENT_LINE = '0.3.0';

interface ConfigModule {
  configSchema?: { shape: Record<string, unknown>; parse(v: unknown): Record<string, unknown> };
  poddConfigSchema?: { shape: Record<string, unknown>; parse(v: unknown): Record<string, unknown> };
  KEY_SINCE?: Readonly<Record<string, string>>;
}

/** readmeMeanings reads the `| key | ... | meaning |` table of a service README: key -> meaning. */
export function readmeMeanings(readme: string): Map<string, string> {
  const out = new Map<string, string>();
  let cols: string[] | undefined;
  for (const line of readme.split('\n')) {
    if (!line.startsWith('|')) {
      cols = undefined;
      continue;
    }
    const cells = line
      .slice(1, line.trimEnd().endsWith('|') ? line.trimEnd().length - 1 : undefined)
      .split(/(?<!\\)\|/)
      .map((x) => x.trim());
    if (!cols) {
      if (cells[0]?.toLowerCase() === 'key' && cells.includes('meaning')) cols = cells.map((x) => x.toLowerCase());
      continue;
    }
    if (cells.every((x) => /^:?-+:?$/.test(x))) continue;
    // one row may name several keys: "`ioReadBps`, `ioWriteBps`" or "defaultVcpus / defaultMemoryMib"
    const keys = (cells[0] ?? '')
      .replace(/`/g, '')
      .split(/[,/]/)
      .map((k) => k.trim())
      .filter((k) => /^[A-Za-z][A-Za-z0-9]*$/.test(k));
    const meaning = cells[cols.indexOf('meaning')] ?? '';
    for (const key of keys) if (!out.has(key)) out.set(key, meaning);
  }
  return out;
}

/**
 * cell is a value as a table cell: JSON in backticks, "(unset)" for undefined. A default that is
 * a path inside the checkout (e.g. the seccomp profile) is shown as `<install dir>/...`: the
 * doc must not depend on where the tree was cloned.
 */
function cell(v: unknown, root: string): string {
  if (v === undefined) return '(unset)';
  const shown = typeof v === 'string' && v.startsWith(root + path.sep) ? `<install dir>/${path.relative(root, v)}` : v;
  const j = JSON.stringify(shown);
  return `\`${j.replace(/\|/g, '\\|')}\``;
}

/** renderConfigDoc is the whole of docs/config.md for the tree at root (built): its hand-written part, the marker, the key tables. */
export function renderConfigDoc(root = REPO_ROOT): string {
  const current = readFileSync(path.join(root, 'docs', 'config.md'), 'utf8');
  const at = current.indexOf(GENERATED_MARKER);
  if (at < 0) throw new Error(`docs/config.md lacks the line ${GENERATED_MARKER}`);
  const parts = [current.slice(0, at).trimEnd(), '', GENERATED_MARKER, ''];
  for (const c of CONFIG_COMPONENTS) {
    const m = require(path.join(root, 'services', c, 'dist', 'config.js')) as ConfigModule;
    const schema = m.configSchema ?? m.poddConfigSchema;
    if (!schema || !m.KEY_SINCE) throw new Error(`services/${c}/dist/config.js exports no schema or KEY_SINCE`);
    for (const k of Object.keys(m.KEY_SINCE)) if (!(k in schema.shape)) throw new Error(`${c}: KEY_SINCE names ${k}, which the schema lacks`);
    const defaults = schema.parse({});
    const meanings = readmeMeanings(readFileSync(path.join(root, 'services', c, 'README.md'), 'utf8'));
    parts.push(`## ${c}`, '', `File: \`--config FILE\` or \`${envKey(c, 'config')}\`; every key also from \`${envKey(c, 'KEY')}\`.`, '');
    parts.push('| key | since | default | env | meaning |', '|---|---|---|---|---|');
    for (const k of Object.keys(schema.shape)) {
      const meaning = meanings.get(k) ?? `(not in services/${c}/README.md)`;
      parts.push(`| \`${k}\` | ${m.KEY_SINCE[k] ?? CURRENT_LINE} | ${cell(defaults[k], root)} | \`${envKey(c, k)}\` | ${meaning} |`);
    }
    parts.push('');
  }
  return `${parts.join('\n').trimEnd()}\n`;
}

if (require.main === module) {
  const out = path.join(REPO_ROOT, 'docs', 'config.md');
  writeFileSync(out, renderConfigDoc());
  process.stdout.write(`wrote ${out}\n`);
}
