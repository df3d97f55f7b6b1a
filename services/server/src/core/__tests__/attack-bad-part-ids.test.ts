/**
 * Adversarial finding (issue 11, bad rows / undeletable ghosts): a runtime record that decodes
 * and is keyed by a good sandbox id passes the quarantine even when the VM or device ids it
 * carries are not ids at all (`../../../x`, `UPPER_CASE`). DeleteSandbox then sends those ids to
 * the supervisor / ublk-manager, which refuse them (INVALID_ARGUMENT), so the delete answers
 * INVALID_ARGUMENT about a field the caller never sent and the record stays DELETING for ever;
 * `sandnode down --purge` stops at it too. Seen on a real node with three such rows. Such a row
 * must be set aside (not served) or deletable.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, RESOURCE_ID_RE, InvalidArgumentError } from '@sandnode/shared';
import { RuntimeRecord } from '@sandnode/shared/proto/server/v1/record';
import { SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import Database from 'better-sqlite3';
import { SqliteRecordStore } from '../../store/sqlite-record-store';
import { SandboxManager } from '../sandbox-manager';
import type { DevicePort, VmPort } from '../types';
import { managerOptions, Peers } from './fake-peers';

const log = createLogger('test', '0', 'silent');

/** as the real peers answer: an id that is not RESOURCE_ID_RE is INVALID_ARGUMENT */
function checked(id: string, field: string): void {
  if (!RESOURCE_ID_RE.test(id)) throw new InvalidArgumentError(`${field}: ${JSON.stringify(id)} is not a valid id`);
}

describe.each([
  ['a VM id with path characters', { vm: { vmId: '../../../x', pid: 1 } }],
  ['a device id with path characters', { devices: [{ deviceId: '../../x', role: 1, path: '/dev/sda', backingFile: '/etc/passwd', sizeBytes: 1 }] }],
  ['a reset upper id in upper case', { resetUpperDeviceId: 'UPPER_CASE' }],
])('a record (ERROR) carrying %s', (_what, fields) => {
  let dir: string;
  let store: SqliteRecordStore;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-attack-ids-'));
    new SqliteRecordStore(path.join(dir, 'records.db'), log).close();
    const db = new Database(path.join(dir, 'records.db'));
    const id = 'sb-8888888888888888';
    const blob = RuntimeRecord.encode(RuntimeRecord.fromPartial({ schema: 1, sandboxId: id, state: SandboxState.SANDBOX_STATE_ERROR, template: 'base', ...fields })).finish();
    db.prepare('INSERT INTO records (sandbox_id, state, request_id, updated_at_ms, record) VALUES (?, ?, ?, ?, ?)').run(id, 'ERROR', '', 1, Buffer.from(blob));
    db.close();
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('is not left listed after DeleteSandbox', async () => {
    const peers = new Peers();
    const vms: VmPort = { ...peers.vmPort, delete: async (id) => (checked(id, 'vm_id'), peers.vmPort.delete(id)) };
    const devices: DevicePort = { ...peers.devicePort, delete: async (id) => (checked(id, 'device_id'), peers.devicePort.delete(id)) };
    const m = new SandboxManager(managerOptions(peers, store, dir, { vms: vms, devices: devices }));
    const listed = () => m.list({ states: [], metadata: {}, pageSize: 0, pageToken: '' }).sandboxes.map((r) => `${r.sandboxId} ${r.state}`);
    if (listed().length) await m.delete('sb-8888888888888888').catch(() => undefined);
    expect(listed()).toEqual([]);
  });
});
