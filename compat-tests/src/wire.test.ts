/**
 * Wire compatibility of the contracts between the release build (N-1, from the compat-tests
 * cache) and this checkout (N). Skips, saying why, when the release build is not cached (build
 * it with the compat runner) or N's generated code is missing (run npm run build).
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { DEFAULT_CACHE_DIR, REPO_ROOT, buildRelease, readReleases, type Build } from './releases';
import type { RunContext } from './types';
import { checkSchemas, checkWire, runWireCompat, UNKNOWN_ENUM_VALUE } from './wire';
import { loadSchema, missingParts, type Codec } from './wire-schema';

function builds(): { older?: Build; n?: Build; reason?: string } {
  const n: Build = { label: 'N', version: 'working-tree', commit: 'working-tree', dir: REPO_ROOT };
  const nMissing = missingParts(n);
  if (nMissing) return { reason: `${nMissing} (run npm run build)` };
  let older: Build;
  try {
    const r = readReleases()[0];
    if (!r) return { reason: 'compat-tests/releases.json lists no release' };
    const dir = path.join(DEFAULT_CACHE_DIR, `${r.version}-${r.commit.slice(0, 12)}`);
    if (!existsSync(path.join(dir, '.sandnode-build.json'))) return { reason: `release ${r.version} is not built in ${dir}` };
    older = buildRelease(r);
  } catch (err) {
    return { reason: `release build unusable: ${(err as Error).message}` };
  }
  const oMissing = missingParts(older);
  if (oMissing) return { reason: oMissing };
  return { older, n };
}

const b = builds();
if (b.reason) console.warn(`wire.test: skipped: ${b.reason}`);
const maybe = b.reason ? describe.skip : describe;

maybe(`wire compatibility N-1 <-> N${b.reason ? ` (skipped: ${b.reason})` : ''}`, () => {
  const older = b.older!;
  const n = b.n!;

  it('every message round-trips both ways, keeps unknown fields, and survives unknown enum values', async () => {
    const t0 = Date.now();
    const r = checkWire([older, n]);
    const failures = r.messages.filter((m) => m.result === 'fail').map((m) => `${m.message}: ${m.failures.slice(0, 3).join(' / ')}`);
    expect(r.problems).toEqual([]);
    expect(failures).toEqual([]);
    // every message of N is checked, and every message of N-1
    const nSchema = loadSchema(n);
    expect(r.messages.length).toBeGreaterThanOrEqual(nSchema.messages.size);
    for (const name of nSchema.messages.keys()) expect(r.messages.some((m) => m.message === name)).toBe(true);
    expect(r.messages.every((m) => m.checks > 0)).toBe(true);
    // every enum field was decoded with an unknown value by both builds, without throwing
    expect(r.enums.length).toBeGreaterThan(0);
    expect(r.enums.every((e) => e.outcome === 'number' || e.outcome === 'UNRECOGNIZED')).toBe(true);
    expect(new Set(r.enums.map((e) => e.reader))).toEqual(new Set([older.label, 'N']));
    expect(Date.now() - t0).toBeLessThan(20000);

    const ctx: RunContext = { builds: { [older.label]: older, N: n }, order: [older.label, 'N'], quick: false, workDir: '/tmp', log: () => undefined };
    const section = await runWireCompat(ctx);
    expect(section.result).toBe('pass');
    expect(section.summary).toMatch(/messages/);
  });

  it('detects a reader that drops unknown fields and one that chokes on unknown enum values', () => {
    const o = loadSchema(older);
    const s = loadSchema(n);
    const wrap = (c: Codec, decode: (bytes: Uint8Array) => Record<string, unknown>): Codec => ({ ...c, decode: (bytes: Uint8Array) => decode(bytes) });
    const name = 'sandnode.server.v1.RuntimeRecord';
    const orig = s.codecs.get(name)!;
    // N's RuntimeRecord reader forgets unknown fields; it must be reported
    s.codecs.set(name, wrap(orig, (bytes) => ({ ...orig.decode(bytes), _unknownFields: {} })));
    let r = checkSchemas([o, s]);
    const rec = r.messages.find((m) => m.message === name)!;
    expect(rec.result).toBe('fail');
    expect(rec.failures.some((f) => /unknown field 9998 length-delimited .* lost on re-encode/.test(f))).toBe(true);
    // N's RuntimeRecord reader throws on an unknown SandboxState
    s.codecs.set(
      name,
      wrap(orig, (bytes) => {
        const m = orig.decode(bytes);
        if (m.state === UNKNOWN_ENUM_VALUE) throw new Error('unknown state');
        return m;
      }),
    );
    r = checkSchemas([o, s]);
    const e = r.enums.find((x) => x.message === name && x.field === 'state' && x.reader === 'N')!;
    expect(e.outcome).toBe('threw');
    expect(r.messages.find((m) => m.message === name)!.failures.some((f) => /unknown enum .*state=999.*threw: unknown state/.test(f))).toBe(true);
  });
});
