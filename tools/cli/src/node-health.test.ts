/**
 * The quarantine / fence part of `sandnode status`: components that do not answer or do not
 * list the report's feature (an older release) are "unknown", never a made-up 0; a peer fenced
 * above the active server's epoch is called out; each quarantined row is named with its reason.
 */
import { useTempDir } from '@sandnode/testkit';
import { healthLines, nodeHealth, type ComponentHealth } from './node-health';

describe('status: quarantine and fences', () => {
  const tmp = useTempDir('cli-health');

  it('nothing answers, or a component lacks the feature: every field is unknown (null), nothing throws', async () => {
    const dir = tmp();
    const dirs = { stateDir: `${dir}/state`, runDir: `${dir}/run`, listen: '' };
    const none = await nodeHealth(dirs, null, 4, {});
    expect(none).toEqual([
      { name: 'vmm-supervisor', quarantined: null, fenceEpoch: null, fencedAboveServer: false, slotQuarantined: null },
      { name: 'ublk-manager', quarantined: null, fenceEpoch: null, fencedAboveServer: false },
      { name: 'server', quarantined: null, fenceEpoch: null, fencedAboveServer: false, networkMismatches: null },
    ]);
    // listing the feature with nothing listening is still unknown
    const down = await nodeHealth(dirs, `unix://${dir}/none.sock`, 4, {
      'vmm-supervisor': ['vmm.quarantine-report.v1', 'vmm.slot-quarantine-report.v1'],
      'ublk-manager': ['ublk.quarantine-report.v1'],
      server: ['server.quarantine-report.v1'],
    });
    expect(down.map((h) => h.quarantined)).toEqual([null, null, null]);
    expect(down[0]!.slotQuarantined).toBeNull();
    expect(healthLines(none, 4)).toEqual([
      'vmm-supervisor fence epoch: unknown',
      'ublk-manager fence epoch: unknown',
      'vmm-supervisor quarantined rows: unknown (down, or a release that does not report them)',
      'vmm-supervisor network slot table quarantined rows: unknown (down, network off, or a release that does not report them)',
      'ublk-manager quarantined rows: unknown (down, or a release that does not report them)',
      'server quarantined rows: unknown (down, or a release that does not report them)',
    ]);
  });

  it('names each quarantined row with its reason and calls out a peer fenced above the server', () => {
    const h: ComponentHealth[] = [
      {
        name: 'vmm-supervisor',
        quarantined: [],
        fenceEpoch: 9,
        fencedAboveServer: true,
        slotQuarantined: [{ key: '3', reason: "a second row of owner sb-0000000000000001: slot 1 (in-use) is that owner's", quarantinedAtMs: 1 }],
      },
      { name: 'ublk-manager', quarantined: [{ key: 'dev-x', reason: 'unknown state "migrating"', quarantinedAtMs: 1 }], fenceEpoch: 4, fencedAboveServer: false },
      { name: 'server', quarantined: [{ key: '', reason: 'row key "" is not a sandbox id', quarantinedAtMs: 0 }], fenceEpoch: null, fencedAboveServer: false },
    ];
    expect(healthLines(h, 4)).toEqual([
      "vmm-supervisor fence epoch: 9 — ABOVE the active server's epoch 4: its mutating calls are ABORTED (a newer server took the lease?)",
      'ublk-manager fence epoch: 4',
      'vmm-supervisor quarantined rows: 0',
      'vmm-supervisor network slot table quarantined rows: 1 (their slots are not handed out; see network_slot_quarantine)',
      "  slot 3: a second row of owner sb-0000000000000001: slot 1 (in-use) is that owner's",
      'ublk-manager quarantined rows: 1 (not served; see its quarantine table)',
      '  "dev-x": unknown state "migrating"',
      'server quarantined rows: 1 (not served; see its quarantine table)',
      '  (no key): row key "" is not a sandbox id',
    ]);
  });

  it('lists the sandboxes whose VM network differed from the record at adoption', () => {
    const h: ComponentHealth[] = [{ name: 'server', quarantined: [], fenceEpoch: null, fencedAboveServer: false, networkMismatches: ['sb-00000000000000a1: its VM has no network'] }];
    expect(healthLines(h, 4)).toEqual([
      'server quarantined rows: 0',
      'server network mismatches at adoption: 1 (VM network differs from the record; kept as is)',
      '  sb-00000000000000a1: its VM has no network',
    ]);
  });
});
