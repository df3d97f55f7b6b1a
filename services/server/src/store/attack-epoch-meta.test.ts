/**
 * Attacker finding (fixed): a records.db whose meta epoch is not a whole number (a bad
 * edit, a bit flip) must not become NaN / Infinity / 3.5 and brick the node at every start
 * ("could not raise the epoch fences to epoch NaN: ... INTERNAL: Request message
 * serialization failure"), nor '' read as 0 (the epoch going back below the peers' fences:
 * "stale epoch 1 ... another server took the lease"). Expected: the store refuses with a
 * message that names records.db and the meta row (or reports it), and never writes a
 * non-integer epoch back.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { createLogger } from '@sandnode/shared';
import { SqliteRecordStore } from './sqlite-record-store';

const log = createLogger('test', '0', 'silent');

describe('records.db meta epoch that is not a whole number', () => {
  let dir: string;
  let file: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-epoch-'));
    file = path.join(dir, 'records.db');
    const s = new SqliteRecordStore(file, log);
    s.bumpEpoch();
    s.close();
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  function setEpoch(v: string): void {
    const db = new Database(file);
    db.prepare("UPDATE meta SET value = ? WHERE key = 'epoch'").run(v);
    db.close();
  }
  function storedEpoch(): string {
    const db = new Database(file, { readonly: true });
    const v = db.prepare<[], { value: string }>("SELECT value FROM meta WHERE key = 'epoch'").get()!.value;
    db.close();
    return v;
  }

  // a fresh start bumps with atLeast 0 (server-node.ts becomeActive after `sandnode up`)
  it.each(['abc', '1e400', '2.5', '-7', ''])('epoch %j: bumpEpoch refuses it naming records.db (not NaN, Infinity, 3.5 or a restart at 1 below the fences), and leaves it as it was', (v) => {
    setEpoch(v);
    const s = new SqliteRecordStore(file, log);
    let got: number | undefined;
    let err: Error | undefined;
    try {
      got = s.bumpEpoch();
    } catch (e) {
      err = e as Error;
    } finally {
      s.close();
    }
    expect({ got, stored: storedEpoch() }).toEqual({ got: undefined, stored: v });
    expect(err?.message).toMatch(/records\.db/);
    expect(err?.message).toMatch(/epoch/);
  });

  it('a whole-number epoch still bumps', () => {
    setEpoch('41');
    const s = new SqliteRecordStore(file, log);
    expect(s.bumpEpoch()).toBe(42);
    s.close();
  });
});
