/**
 * A build's generated ts-proto code, checked against its own descriptor set: every message of
 * the descriptor set has an export with encode/decode/fromPartial in the module of its proto
 * file (`genDir(b)/<file>.js`), its base object has exactly the properties the descriptor
 * implies, and no module exports a message the descriptor set lacks. The wire-level agreement
 * (ts-proto bytes read by the descriptor) is `referenceCheck` in checks.ts.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import type { Build } from '../releases';
import { genDir } from './build-paths';
import { loadDescriptorSet, schemaFromDescriptorSet, type Codec, type Schema } from './schema';

function isCodec(v: unknown): v is Codec {
  const c = v as Partial<Codec> | null;
  return !!c && typeof c === 'object' && typeof c.encode === 'function' && typeof c.decode === 'function' && typeof c.fromPartial === 'function';
}

/**
 * attachCodecs requires the generated module of every proto file of s from dir, fills
 * s.codecs and appends to s.problems every disagreement (a missing module or export names the
 * file and the export). Returns s.
 */
export function attachCodecs(s: Schema, dir: string): Schema {
  const files = new Set([...s.messages.values()].map((m) => m.file));
  const modules = new Map<string, { js: string; exports: Record<string, unknown>; unclaimed: Set<string> }>();
  for (const file of files) {
    const js = path.join(dir, file.replace(/\.proto$/, '.js'));
    if (!existsSync(js)) {
      s.problems.push(`${file}: generated module ${js} missing`);
      continue;
    }

    const exports = require(js) as Record<string, unknown>;
    modules.set(file, { js, exports, unclaimed: new Set(Object.keys(exports).filter((k) => isCodec(exports[k]))) });
  }
  for (const m of s.messages.values()) {
    const mod = modules.get(m.file);
    if (!mod) continue;
    const codec = mod.exports[m.exportName];
    if (!isCodec(codec)) {
      s.problems.push(`${m.fullName}: in the descriptor set but ${mod.js} exports no ${m.exportName}`);
      continue;
    }
    mod.unclaimed.delete(m.exportName);
    s.codecs.set(m.fullName, codec);
    // The generated base object must have exactly the properties the descriptor implies.
    const base = codec.fromPartial({});
    const want = new Set(m.fields.map((f) => f.prop));
    const have = new Set(Object.keys(base).filter((k) => k !== '_unknownFields'));
    const missing = [...want].filter((p) => !have.has(p));
    const extra = [...have].filter((p) => !want.has(p));
    if (missing.length || extra.length) {
      s.problems.push(`${m.fullName}: generated code and descriptor disagree (descriptor-only: ${missing.join(', ') || '-'}; generated-only: ${extra.join(', ') || '-'})`);
    }
  }
  for (const [file, mod] of modules) {
    for (const n of mod.unclaimed) s.problems.push(`${file}: generated code exports message ${n}, which is not in the descriptor set`);
  }
  return s;
}

/** loadSchema reads a build's descriptor set and attaches its generated codecs. Throws when the descriptor set is unreadable. */
export function loadSchema(b: Build): Schema {
  return attachCodecs(schemaFromDescriptorSet(b, loadDescriptorSet(b)), genDir(b));
}
