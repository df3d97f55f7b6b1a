/**
 * Adversarial finding (issue 11, "one bad row takes the node down" / serve the good rows):
 * ListSandboxes bounds a page by count (1..1000) but not by bytes. A sandbox may carry 64
 * metadata entries of 63-byte keys and 256-byte values (CreateSandbox accepts it: ~20 KB a
 * sandbox), so 210 such sandboxes make a 1000-page (what the CLI asks for) of ~4.3 MB, above
 * grpc-js's 4 MiB message limit: seen on a real node, `sandnode sandbox list`, `sandnode status`
 * and `sandnode down --purge` all failed with RESOURCE_EXHAUSTED "Sent message larger than max
 * (4330235 vs. 4194304)" until rows were removed by hand. One row with a 5 MB blob does the same.
 * A page must fit the limit (fewer sandboxes in it, next_page_token set), and paging must still
 * reach every sandbox.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger } from '@sandnode/shared';
import { ListSandboxesResponse } from '@sandnode/shared/proto/server/v1/sandbox';
import { managerOptions, Peers } from '../../core/__tests__/fake-peers';
import { SandboxManager } from '../../core/sandbox-manager';
import { SqliteRecordStore } from '../../store/sqlite-record-store';
import { sandboxService } from '../sandbox-service';

const log = createLogger('test', '0', 'silent');
/** grpc-js's default max send (and receive) message length, bytes. */
const GRPC_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

describe('ListSandboxes with many sandboxes that carry the most metadata CreateSandbox accepts', () => {
  let dir: string;
  let store: SqliteRecordStore;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-attack-list-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('answers pages that fit a gRPC message and together name every sandbox', async () => {
    const peers = new Peers();
    const m = new SandboxManager(managerOptions(peers, store, dir));
    const metadata: Record<string, string> = {};
    for (let i = 0; i < 64; i++) metadata[`k${String(i).padStart(2, '0')}-${'k'.repeat(59)}`] = 'v'.repeat(256);
    const ids: string[] = [];
    for (let i = 0; i < 210; i++) ids.push((await m.create({ template: 'base', timeoutSeconds: 0, metadata, resources: undefined, requestId: '' })).sandboxId);

    const svc = sandboxService(m);
    const ctx = { signal: new AbortController().signal } as unknown as Parameters<typeof svc.listSandboxes>[1];
    const seen: string[] = [];
    let token = '';
    for (let pages = 0; pages < 1000; pages++) {
      const page = await svc.listSandboxes({ states: [], metadata: {}, pageSize: 1000, pageToken: token }, ctx);
      expect(ListSandboxesResponse.encode(ListSandboxesResponse.fromPartial(page)).finish().length).toBeLessThanOrEqual(GRPC_MAX_MESSAGE_BYTES);
      seen.push(...(page.sandboxes ?? []).map((s) => s.sandboxId ?? ''));
      token = page.nextPageToken ?? '';
      if (!token) break;
    }
    expect(seen.sort()).toEqual(ids.sort());
  });
});
