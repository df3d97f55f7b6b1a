/**
 * Wire compatibility: N alone and against every release built in the compat-tests cache
 * (`npm run compat -- --only wire --skip` builds them), plus proofs that the checks fail: a field
 * renumbered in a scratch copy of N's descriptor set, a reader that drops unknown fields, one
 * that throws on unknown enum values, and missing build parts (a failure under CI=true).
 *
 * N's descriptor set and generated code come from `npm run build`: missing under CI=true they
 * fail the suite; otherwise it skips, saying why. A release that is not built is skipped with
 * the reason (in CI the compat run builds and checks every release).
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import * as descriptor from 'protobufjs/ext/descriptor';
import { optionalHook } from './main';
import { DEFAULT_CACHE_DIR, REPO_ROOT, readReleases, type Build } from './releases';
import type { RunContext } from './types';
import {
  attachCodecs,
  checkSchemas,
  checkWire,
  ciStrict,
  descriptorPath,
  genDir,
  loadDescriptorSet,
  loadSchema,
  missingParts,
  runWireCompat,
  schemaFromDescriptorSet,
  UNKNOWN_ENUM_VALUE,
  type Codec,
  type Schema,
} from './wire';

const N: Build = { label: 'N', version: 'working-tree', commit: 'working-tree', dir: REPO_ROOT };
const nMissing = missingParts(N);
if (nMissing.length && ciStrict()) {
  test('N has its descriptor set and generated modules (CI=true)', () => {
    throw new Error(`CI=true: ${nMissing.join('; ')} (npm run build makes them)`);
  });
} else if (nMissing.length) console.warn(`wire.test: N skipped: ${nMissing.join('; ')} (run npm run build)`);

/** The releases built in the cache (oldest first), and why the others are not used. */
function builtReleases(): { builds: Build[]; skipped: string[] } {
  const builds: Build[] = [];
  const skipped: string[] = [];
  for (const r of readReleases()) {
    const dir = path.join(DEFAULT_CACHE_DIR, `${r.version}-${r.commit.slice(0, 12)}`);
    const b: Build = { label: r.version, version: r.version, commit: r.commit, dir };
    if (!existsSync(path.join(dir, '.sandnode-build.json'))) skipped.push(`release ${r.version} is not built in ${dir} (npm run compat -- --only wire --skip builds it)`);
    else if (missingParts(b).length) skipped.push(...missingParts(b));
    else builds.push(b);
  }
  return { builds, skipped };
}

const RECORD = 'sandnode.server.v1.RuntimeRecord';

/** renumbered is N's descriptor set with RuntimeRecord.state moved from its number to `to`. */
function renumbered(to: number): Uint8Array {
  const set = descriptor.FileDescriptorSet.decode(loadDescriptorSet(N)) as unknown as {
    file: Array<{ package?: string; messageType?: Array<{ name: string; field?: Array<{ name: string; number: number }> }> }>;
  };
  const msg = set.file
    .filter((f) => f.package === 'sandnode.server.v1')
    .flatMap((f) => f.messageType ?? [])
    .find((m) => m.name === 'RuntimeRecord')!;
  const state = msg.field!.find((f) => f.name === 'state')!;
  expect(state.number).not.toBe(to);
  state.number = to;
  return descriptor.FileDescriptorSet.encode(set as unknown as descriptor.IFileDescriptorSet).finish();
}

const withN = nMissing.length ? describe.skip : describe;

withN('wire compatibility of N with itself', () => {
  it('every message round-trips through its code and its descriptor, keeps unknown fields and survives unknown enum values', () => {
    const r = checkWire([N]);
    expect(r.problems).toEqual([]);
    expect(r.messages.filter((m) => m.result === 'fail').map((m) => `${m.message}: ${m.failures.slice(0, 3).join(' / ')}`)).toEqual([]);
    const s = loadSchema(N);
    expect(r.messages.map((m) => m.message).sort()).toEqual([...s.messages.keys()].sort());
    expect(r.messages.every((m) => m.checks > 0)).toBe(true);
    expect(r.messages.filter((m) => m.mapEntry).length).toBeGreaterThan(0);
    expect(r.enums.length).toBeGreaterThan(0);
    expect(r.enums.every((e) => e.outcome === 'number' || e.outcome === 'UNRECOGNIZED')).toBe(true);
  });

  it('catches a field renumbered in the descriptor set while the generated code still uses the old number', () => {
    const scratch = attachCodecs(schemaFromDescriptorSet(N, renumbered(33)), genDir(N));
    expect(scratch.problems).toEqual([]); // same names: only the wire shows it
    const rec = checkSchemas([scratch]).messages.find((m) => m.message === RECORD)!;
    expect(rec.result).toBe('fail');
    // N's code writes state at 3; N's (scratch) descriptor reads 33
    expect(rec.failures.some((f) => /read by N's descriptor: RuntimeRecord\.state: expected \d+, got 0/.test(f))).toBe(true);
    expect(rec.failures.some((f) => /written by N's descriptor: RuntimeRecord\.state: expected \d+, got 0/.test(f))).toBe(true);
  });

  it('catches a reader that keeps top-level unknown fields but drops those of a nested message', () => {
    const s = loadSchema(N);
    const orig = s.codecs.get(RECORD)!;
    const decode = (bytes: Uint8Array) => {
      const m = orig.decode(bytes);
      return { ...m, vm: m.vm ? { ...(m.vm as Record<string, unknown>), _unknownFields: {} } : m.vm };
    };
    s.codecs.set(RECORD, { ...orig, decode });
    const rec = checkSchemas([s]).messages.find((m) => m.message === RECORD)!;
    expect(rec.failures).toEqual(['unknown fields N->N: unknown field 9995 inside RuntimeRecord.vm lost on re-encode']);
  });

  it('catches generated code that lacks a message of the descriptor set', () => {
    const s = schemaFromDescriptorSet(N, loadDescriptorSet(N));
    const tmp = mkdtempSync(path.join(os.tmpdir(), 'wire-gen-'));
    try {
      const r = checkSchemas([attachCodecs(s, tmp)]);
      expect(r.problems.some((p) => p.includes('sandnode/server/v1/') && p.includes(tmp) && p.includes('missing'))).toBe(true);
      expect(r.messages.find((m) => m.message === RECORD)!.failures).toContain('N has no generated codec for it');
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });
});

const rel = builtReleases();
if (rel.skipped.length && ciStrict()) {
  // .ci/run builds the releases (npm run compat -- --only wire --skip) before the tests
  test('the releases are built (CI=true)', () => {
    throw new Error(`CI=true: ${rel.skipped.join('; ')}`);
  });
} else if (rel.skipped.length) console.warn(`wire.test: releases skipped: ${rel.skipped.join('; ')}`);
const withReleases = nMissing.length || rel.builds.length === 0 ? describe.skip : describe;
const names = rel.builds.map((b) => b.label).join(', ') || 'none built';

withReleases(`wire compatibility of the releases (${names}) with N`, () => {
  const newest = rel.builds[rel.builds.length - 1]!;

  it('every message of every build round-trips both ways, keeps unknown fields, and survives unknown enum values', async () => {
    const t0 = Date.now();
    const r = checkWire([...rel.builds, N]);
    expect(r.problems).toEqual([]);
    expect(r.messages.filter((m) => m.result === 'fail').map((m) => `${m.message}: ${m.failures.slice(0, 3).join(' / ')}`)).toEqual([]);
    for (const b of [...rel.builds, N]) for (const name of loadSchema(b).messages.keys()) expect(r.messages.some((m) => m.message === name)).toBe(true);
    expect(new Set(r.enums.map((e) => e.reader))).toEqual(new Set([...rel.builds.map((b) => b.label), 'N']));
    expect(r.enums.every((e) => e.outcome === 'number' || e.outcome === 'UNRECOGNIZED')).toBe(true);
    expect(Date.now() - t0).toBeLessThan(20000);

    const ctx: RunContext = {
      builds: Object.fromEntries([...rel.builds, N].map((b) => [b.label, b])),
      order: [...rel.builds.map((b) => b.label), 'N'],
      quick: false,
      workDir: '/tmp',
      log: () => undefined,
    };
    const section = await runWireCompat(ctx, {});
    expect(section.result).toBe('pass');
    expect(section.summary).toMatch(/messages/);
  });

  it('covers the network contracts (issue 12): its messages are checked in N, its fields of older messages cross every release as unknown fields and back', () => {
    const r = checkWire([...rel.builds, N]);
    const byName = new Map(r.messages.map((m) => [m.message, m]));
    const added = [
      'sandnode.common.v1.EgressPolicy',
      'sandnode.vmm.v1.NetworkSpec',
      'sandnode.vmm.v1.VmNetwork',
      'sandnode.vmm.v1.UpdateVmNetworkRequest',
      'sandnode.vmm.v1.ListNetworkSlotsResponse',
      'sandnode.vmm.v1.NetworkSlot',
      'sandnode.vmm.v1.ReleaseNetworkSlotRequest',
      'sandnode.server.v1.SandboxNetworkRequest',
      'sandnode.server.v1.SandboxNetwork',
      'sandnode.server.v1.UpdateSandboxNetworkRequest',
      'sandnode.server.v1.NetworkRecord',
      'sandnode.podd.v1.ForwardPortRequest',
      'sandnode.podd.v1.ForwardPortResponse',
    ];
    for (const name of added) {
      expect([name, byName.get(name)?.scope, byName.get(name)?.result]).toEqual([name, 'new in N', 'pass']);
      expect(byName.get(name)!.checks).toBeGreaterThan(0);
    }
    // message -> the field number N added to it; every release lacks it, so the N -> release checks carry it as an unknown field
    const extended: Record<string, number> = {
      'sandnode.server.v1.CreateSandboxRequest': 6,
      'sandnode.server.v1.CreateSandboxResponse': 2,
      'sandnode.server.v1.Sandbox': 14,
      'sandnode.server.v1.ForkSandboxRequest': 6,
      'sandnode.server.v1.RuntimeRecord': 25,
      'sandnode.server.v1.PrepareHandoverResponse': 5,
      'sandnode.server.v1.HandoverRequest': 6,
      'sandnode.vmm.v1.VmSpec': 8,
      'sandnode.vmm.v1.Vm': 11,
      'sandnode.vmm.v1.DeleteVmRequest': 2,
    };
    for (const [name, num] of Object.entries(extended)) {
      // "partial": a message 0.2.0 added (ForkSandboxRequest) is checked against N alone where the older release lacks it
      expect([name, byName.get(name)?.result]).toEqual([name, 'pass']);
      expect(['both', 'partial']).toContain(byName.get(name)?.scope);
      expect(
        loadSchema(N)
          .messages.get(name)!
          .fields.some((f) => f.number === num),
      ).toBe(true);
      const has = rel.builds.filter((b) => loadSchema(b).messages.has(name));
      expect(has.length).toBeGreaterThan(0);
      for (const b of has)
        expect([
          b.label,
          name,
          loadSchema(b)
            .messages.get(name)!
            .fields.some((f) => f.number === num),
        ]).toEqual([b.label, name, false]);
    }
  });

  it(`catches a renumbered field against ${rel.builds.at(-1)?.label ?? 'the latest release'}: removed without reserving, and values lost`, () => {
    const scratch = attachCodecs(schemaFromDescriptorSet(N, renumbered(33)), genDir(N));
    const rec = checkSchemas([loadSchema(newest), scratch]).messages.find((m) => m.message === RECORD)!;
    expect(rec.failures).toContain(`schema ${newest.label}->N: field state = 3 removed without reserving its number and name`);
    // N's code still reads number 3 as state: what 0.2.0 wrote there is not kept as unknown, and field 33 "has" its value
    expect(rec.failures).toContain(`${newest.label}->N: RuntimeRecord.state (3): known only to ${newest.label}, not kept in N's unknown fields`);
    expect(rec.failures.some((f) => f.startsWith(`${newest.label}->N: RuntimeRecord.state (33): known only to N but decoded as`))).toBe(true);
    expect(rec.failures.some((f) => f.startsWith(`N->${newest.label}: read by ${newest.label}'s descriptor: RuntimeRecord.state (3): known only to ${newest.label}`))).toBe(true);
  });

  it('detects a reader that drops unknown fields and one that chokes on unknown enum values', () => {
    const o = loadSchema(newest);
    const s: Schema = loadSchema(N);
    const wrap = (c: Codec, decode: (bytes: Uint8Array) => Record<string, unknown>): Codec => ({ ...c, decode: (bytes: Uint8Array) => decode(bytes) });
    const orig = s.codecs.get(RECORD)!;
    s.codecs.set(
      RECORD,
      wrap(orig, (bytes) => ({ ...orig.decode(bytes), _unknownFields: {} })),
    );
    let r = checkSchemas([o, s]);
    const rec = r.messages.find((m) => m.message === RECORD)!;
    expect(rec.result).toBe('fail');
    expect(rec.failures.some((f) => /unknown field 9998 length-delimited .* lost on re-encode/.test(f))).toBe(true);
    s.codecs.set(
      RECORD,
      wrap(orig, (bytes) => {
        const m = orig.decode(bytes);
        if (m.state === UNKNOWN_ENUM_VALUE) throw new Error('unknown state');
        return m;
      }),
    );
    r = checkSchemas([o, s]);
    const e = r.enums.find((x) => x.message === RECORD && x.field === 'state' && x.reader === 'N')!;
    expect(e.outcome).toBe('threw');
    expect(r.messages.find((m) => m.message === RECORD)!.failures.some((f) => /unknown enum .*state=999.*threw: unknown state/.test(f))).toBe(true);
  });
});

describe('missing build parts are never passed silently', () => {
  let tmp: string;
  beforeEach(() => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'wire-parts-'));
  });
  afterEach(() => rmSync(tmp, { recursive: true, force: true }));

  it('descriptorPath and genDir prefer packages/shared and fall back to shared', () => {
    const b: Build = { label: 'x', version: 'x', commit: 'x', dir: tmp };
    expect(descriptorPath(b)).toBe(path.join(tmp, 'packages', 'shared', 'descriptor', 'sandnode.binpb'));
    mkdirSync(path.join(tmp, 'shared', 'descriptor'), { recursive: true });
    writeFileSync(path.join(tmp, 'shared', 'descriptor', 'sandnode.binpb'), '');
    expect(descriptorPath(b)).toBe(path.join(tmp, 'shared', 'descriptor', 'sandnode.binpb'));
    mkdirSync(path.join(tmp, 'packages', 'shared', 'descriptor'), { recursive: true });
    writeFileSync(path.join(tmp, 'packages', 'shared', 'descriptor', 'sandnode.binpb'), '');
    expect(descriptorPath(b)).toBe(path.join(tmp, 'packages', 'shared', 'descriptor', 'sandnode.binpb'));
    expect(missingParts(b)).toEqual([`build x lacks its generated modules (${path.join(tmp, 'packages', 'shared', 'dist', 'gen')} or ${path.join(tmp, 'shared', 'dist', 'gen')})`]);
    mkdirSync(path.join(tmp, 'shared', 'dist', 'gen'), { recursive: true });
    expect(genDir(b)).toBe(path.join(tmp, 'shared', 'dist', 'gen'));
    expect(missingParts(b)).toEqual([]);
  });

  it('a build without its descriptor set fails the wire section under CI=true and skips it otherwise, naming the file', async () => {
    const broken: Build = { label: '0.0.1', version: '0.0.1', commit: 'x', dir: tmp };
    const ctx: RunContext = { builds: { '0.0.1': broken, N }, order: ['0.0.1', 'N'], quick: true, workDir: tmp, log: () => undefined };
    const ci = await runWireCompat(ctx, { CI: 'true' });
    expect(ci.result).toBe('fail');
    expect(ci.summary).toContain(path.join(tmp, 'packages', 'shared', 'descriptor', 'sandnode.binpb'));
    const local = await runWireCompat(ctx, {});
    expect(local.result).toBe('skipped');
    expect(local.summary).toContain(`build 0.0.1 lacks its descriptor set (${path.join(tmp, 'packages', 'shared', 'descriptor', 'sandnode.binpb')}`);
  });

  it('a missing mode module or export is a failed section under CI=true and a skipped one otherwise', async () => {
    const ctx: RunContext = { builds: {}, order: [], quick: true, workDir: tmp, log: () => undefined };
    const ci = await optionalHook('wire', 'runWireCompat', ctx, { CI: 'true' }, tmp);
    expect(ci).toHaveLength(1);
    expect(ci[0]!.result).toBe('fail');
    expect(ci[0]!.summary).toContain(path.join(tmp, 'wire.js'));
    const local = await optionalHook('wire', 'runWireCompat', ctx, {}, tmp);
    expect(local[0]!.result).toBe('skipped');
    writeFileSync(path.join(tmp, 'wire.js'), 'exports.somethingElse = () => undefined;\n');
    const noExport = await optionalHook('wire', 'runWireCompat', ctx, { CI: 'true' }, tmp);
    expect(noExport[0]!.result).toBe('fail');
    expect(noExport[0]!.summary).toContain('exports no function runWireCompat');
  });
});
