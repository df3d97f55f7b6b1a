/**
 * SandboxManager.list cuts a page by bytes (issue 11, finding 5): it stops before the sizes
 * would pass maxPageBytes, always takes the first record (so paging moves on), and sets the
 * token exactly when matches remain.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@sandnode/shared';
import { managerOptions, Peers } from '../../core/__tests__/fake-peers';
import { SandboxManager } from '../../core/sandbox-manager';
import { SqliteRecordStore } from '../../store/sqlite-record-store';

const log = createLogger('test', '0', 'silent');

describe('ListSandboxes pages cut by bytes', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let m: SandboxManager;
  const ids: string[] = [];

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-list-bytes-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    const peers = new Peers();
    m = new SandboxManager(managerOptions(peers, store, dir));
    for (let i = 0; i < 5; i++) ids.push((await m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '' })).sandboxId);
    ids.sort();
  });
  afterAll(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** pages lists everything with the given sizes, answering the ids of each page. */
  function pages(sizeOf: () => number, maxPageBytes: number): string[][] {
    const out: string[][] = [];
    let pageToken = '';
    do {
      const p = m.list({ states: [], metadata: {}, pageSize: 1000, pageToken, sizeOf, maxPageBytes });
      out.push(p.sandboxes.map((r) => r.sandboxId));
      pageToken = p.nextPageToken;
    } while (pageToken && out.length < 10);
    return out;
  }

  it('holds as many records as fit the bound', () => {
    expect(pages(() => 10, 20)).toEqual([ids.slice(0, 2), ids.slice(2, 4), ids.slice(4)]);
    expect(pages(() => 10, 50)).toEqual([ids]);
  });

  it('takes one record a page when one alone is over the bound, and still reaches every record', () => {
    expect(pages(() => 100, 20)).toEqual(ids.map((id) => [id]));
  });
});
