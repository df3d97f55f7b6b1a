/**
 * NetworkRecord in the runtime record (issue 12): round trip, unknown fields of a newer
 * server inside it survive a rewrite, records of 0.2.0 (no network field, network_slot -1 or 0)
 * read as no network and keep their network_slot, and a bad network field quarantines the row.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BinaryReader, BinaryWriter } from '@bufbuild/protobuf/wire';
import { createLogger } from '@sandnode/shared';
import { NetworkRecord, RuntimeRecord } from '@sandnode/shared/proto/server/v1/record';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import Database from 'better-sqlite3';
import { sandboxToPb } from '../rpc/convert';
import { decodeRecord, encodeRecord } from './record-codec';
import { SqliteRecordStore } from './sqlite-record-store';

const ID = 'sb-0123456789abcdef';
const HASH = 'ab'.repeat(32);
const NET = {
  slot: 3,
  address: '10.209.0.14',
  gateway: '10.209.0.13',
  egress: { allowOut: ['198.51.100.0/24', 'example.com'], denyOut: [], blockAll: true },
  public: true,
  accessTokenSha256: HASH,
  hostIfname: 'sn1a2bv3',
};

function recordBytes(network: Partial<NetworkRecord> | undefined, networkSlot = -1): Uint8Array {
  return RuntimeRecord.encode(RuntimeRecord.fromPartial({ schema: 1, sandboxId: ID, state: SandboxState.SANDBOX_STATE_RUNNING, template: 'base', networkSlot, network })).finish();
}

describe('runtime record codec: network', () => {
  it('round-trips the network and mirrors its slot in network_slot; the public view shows it with the ingress URL', () => {
    const rec = decodeRecord(recordBytes(undefined));
    rec.network = { ...NET, egress: { ...NET.egress } };
    const msg = RuntimeRecord.decode(encodeRecord(rec));
    expect(msg.networkSlot).toBe(3);
    expect(decodeRecord(encodeRecord(rec)).network).toEqual(NET);
    expect(sandboxToPb(decodeRecord(encodeRecord(rec)), { listen: '127.0.0.1:8480', domain: 'localhost' }).network).toEqual({
      slot: 3,
      address: '10.209.0.14',
      gateway: '10.209.0.13',
      egress: NET.egress,
      public: true,
      ingressUrl: `http://{port}-${ID}.localhost:8480`,
    });
    expect(sandboxToPb(decodeRecord(encodeRecord(rec))).network?.ingressUrl).toBe('');
  });

  it('keeps fields a newer server added to NetworkRecord across a rewrite', () => {
    const known = NetworkRecord.encode(NetworkRecord.fromPartial(NET)).finish();
    const extra = new BinaryWriter()
      .uint32((40 << 3) | 2)
      .string('ipv6 of the future')
      .finish();
    const net = Uint8Array.from([...known, ...extra]);
    const w = new BinaryWriter();
    w.uint32((25 << 3) | 2).bytes(net);
    const bytes = Uint8Array.from([...recordBytes(undefined, 3), ...w.finish()]);
    const rec = decodeRecord(bytes);
    expect(rec.network?.slot).toBe(3);
    rec.network!.public = false;
    const out = RuntimeRecord.decode(encodeRecord(rec));
    const r = new BinaryReader(NetworkRecord.encode(out.network!).finish());
    const seen: number[] = [];
    while (r.pos < r.len) {
      const [no, wt] = r.tag();
      seen.push(no);
      r.skip(wt);
    }
    expect(seen).toContain(40);
    expect(out.network?.public).toBe(false);
  });

  it.each([-1, 0])('a record of 0.2.0 (no network field, network_slot %d) reads as no network and a rewrite keeps network_slot', (slot) => {
    const rec = decodeRecord(recordBytes(undefined, slot));
    expect(rec.network).toBeUndefined();
    expect(sandboxToPb(rec).network).toBeUndefined();
    rec.metadata.k = 'v';
    expect(RuntimeRecord.decode(encodeRecord(rec)).networkSlot).toBe(slot);
  });

  it('a new record without network writes network_slot -1 and no network field', () => {
    const rec = decodeRecord(recordBytes(undefined));
    delete rec.opaque;
    const msg = RuntimeRecord.decode(encodeRecord(rec));
    expect(msg.networkSlot).toBe(-1);
    expect(msg.network).toBeUndefined();
  });

  it.each([
    ['a slot below -1', { ...NET, slot: -2 }, /slot -2/],
    ['an address that is not IPv4', { ...NET, address: 'fe80::1' }, /not IPv4/],
    ['a policy the parser refuses', { ...NET, egress: { allowOut: ['10.1.2.3/8'], denyOut: [], blockAll: false } }, /network\.egress\.allow_out\[0\]/],
    ['a token hash that is not 64 hex digits', { ...NET, accessTokenSha256: 'secret' }, /access_token_sha256/],
  ])('a bad network field (%s) does not decode: the row is quarantined, the others served', (_what, net, why) => {
    expect(() => decodeRecord(recordBytes(net, net.slot))).toThrow(why);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-netrec-'));
    try {
      const log = createLogger('test', '0', 'silent');
      const file = path.join(dir, 'records.db');
      const store = new SqliteRecordStore(file, log);
      const good = decodeRecord(recordBytes(NET, 3));
      store.put({ ...good, sandboxId: 'sb-00000000000000aa', opaque: undefined });
      store.put(good);
      store.close();
      const raw = new Database(file);
      raw.prepare('UPDATE records SET record = ? WHERE sandbox_id = ?').run(Buffer.from(recordBytes(net, net.slot)), ID);
      raw.close();
      const again = new SqliteRecordStore(file, log);
      expect(again.get(ID)).toBeUndefined();
      expect(again.quarantined.get(ID)).toMatch(why);
      expect(again.get('sb-00000000000000aa')?.network).toEqual(NET);
      again.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
