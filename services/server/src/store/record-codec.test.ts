import { BinaryReader, BinaryWriter } from '@bufbuild/protobuf/wire';
import { FailedPreconditionError } from '@sandnode/shared';
import { RuntimeRecord } from '@sandnode/shared/proto/server/v1/record';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { decodeRecord, encodeRecord } from './record-codec';
import { sandboxToPb } from '../rpc/convert';

function newerWriterBytes(schema: number): Uint8Array {
  const known = RuntimeRecord.encode(
    RuntimeRecord.fromPartial({ schema, sandboxId: 'sb-0123456789abcdef', state: SandboxState.SANDBOX_STATE_RUNNING, template: 'base', metadata: { a: 'b' } }),
  ).finish();
  // field 99 (a string a newer server added) and field 98 (a varint)
  const extra = new BinaryWriter()
    .uint32((99 << 3) | 2)
    .string('from the future')
    .uint32((98 << 3) | 0)
    .uint64(42)
    .finish();
  return Uint8Array.from([...known, ...extra]);
}

function fieldsOf(bytes: Uint8Array): Map<number, unknown> {
  const r = new BinaryReader(bytes);
  const out = new Map<number, unknown>();
  while (r.pos < r.len) {
    const [no, wt] = r.tag();
    out.set(no, wt === 2 ? Buffer.from(r.bytes()).toString() : (r.skip(wt), true));
  }
  return out;
}

describe('runtime record codec', () => {
  it('keeps fields a newer server wrote across a read-modify-write', () => {
    const rec = decodeRecord(newerWriterBytes(1));
    rec.state = 'PAUSED';
    rec.metadata.c = 'd';
    const out = encodeRecord(rec);
    const fields = fieldsOf(out);
    expect(fields.get(99)).toBe('from the future');
    expect(fields.has(98)).toBe(true);
    const again = decodeRecord(out);
    expect(again.state).toBe('PAUSED');
    expect(again.metadata).toEqual({ a: 'b', c: 'd' });
  });

  it('issue 10: keeps the isolation of the VM; a record of an older server (no isolation) shows none in the public view, so does a DRAINED one', () => {
    const old = decodeRecord(
      RuntimeRecord.encode(
        RuntimeRecord.fromPartial({ schema: 1, sandboxId: 'sb-0123456789abcdef', state: SandboxState.SANDBOX_STATE_RUNNING, vm: { vmId: 'sb-0123456789abcdef', driver: 'runc', pid: 7 } }),
      ).finish(),
    );
    expect(sandboxToPb(old).isolation).toEqual([]);
    old.vm!.isolation = ['vmm.cgroup-ns.v1', 'vmm.seccomp.v1'];
    const again = decodeRecord(encodeRecord(old));
    expect(again.vm?.isolation).toEqual(['vmm.cgroup-ns.v1', 'vmm.seccomp.v1']);
    expect(sandboxToPb(again).isolation).toEqual(['vmm.cgroup-ns.v1', 'vmm.seccomp.v1']);
    expect(sandboxToPb({ ...again, state: 'DRAINED' }).isolation).toEqual([]);
  });

  it('refuses a schema newer than it reads, naming both', () => {
    expect(() => decodeRecord(newerWriterBytes(2))).toThrow(FailedPreconditionError);
    expect(() => decodeRecord(newerWriterBytes(2))).toThrow(/schema 2 .*schema 1/);
  });

  it('calls a schema no release writes (a huge varint) a damaged row, not a newer one to upgrade for', () => {
    for (const schema of [102, 0xffffffff]) {
      const err = (() => {
        try {
          decodeRecord(newerWriterBytes(schema));
        } catch (e) {
          return e as Error;
        }
        throw new Error('decoded');
      })();
      expect(err).not.toBeInstanceOf(FailedPreconditionError);
      expect(err.message).toMatch(new RegExp(`schema ${schema} is no schema any sandnode writes .*damaged, not newer`));
      expect(err.message).not.toMatch(/upgrade/);
    }
    expect(() => decodeRecord(newerWriterBytes(101))).toThrow(/newer than schema 1 .*upgrade the server/);
  });

  it('maps an unknown state value to UNKNOWN instead of failing', () => {
    const bytes = RuntimeRecord.encode(RuntimeRecord.fromPartial({ schema: 1, sandboxId: 'sb-0123456789abcdef', state: 42 as SandboxState })).finish();
    expect(decodeRecord(bytes).state).toBe('UNKNOWN');
  });

  it("keeps a newer server's state across a read-modify-write that does not move it", () => {
    const bytes = RuntimeRecord.encode(RuntimeRecord.fromPartial({ schema: 1, sandboxId: 'sb-0123456789abcdef', state: 42 as SandboxState })).finish();
    const rec = decodeRecord(bytes);
    rec.expiresAtMs = 1234;
    const again = RuntimeRecord.decode(encodeRecord(rec));
    expect(again.state).toBe(42);
    expect(again.expiresAtMs).toBe(1234);
    // a move (DeleteSandbox's teardown) writes the new state
    rec.state = 'DELETING';
    expect(RuntimeRecord.decode(encodeRecord(rec)).state).toBe(SandboxState.SANDBOX_STATE_DELETING);
  });

  it('stamps a new record with network slot -1 (no network) and keeps a read one', () => {
    const fresh = decodeRecord(RuntimeRecord.encode(RuntimeRecord.fromPartial({ schema: 1, sandboxId: 'sb-0123456789abcdef' })).finish());
    delete fresh.opaque;
    expect(RuntimeRecord.decode(encodeRecord(fresh)).networkSlot).toBe(-1);
    const read = decodeRecord(RuntimeRecord.encode(RuntimeRecord.fromPartial({ schema: 1, sandboxId: 'sb-0123456789abcdef', networkSlot: 3 })).finish());
    expect(RuntimeRecord.decode(encodeRecord(read)).networkSlot).toBe(3);
  });
});
