import { checkInvariants, type Expectation, type NodeSnapshot } from './invariants';
import { Model, REQUEST_KEY } from './model';
import { describeAction, payload, planActions, SERVER_HANDOVER_FAILPOINTS, UBLK_HANDOVER_FAILPOINTS } from './plan';
import { expectedStdout } from './calls';

const A = 'sb-00000000000000a1';
const B = 'sb-00000000000000b2';

/** healthy is a node with one active server, the three daemons and sandbox A running with all its parts. */
function healthy(): NodeSnapshot {
  return {
    servers: [{ admin: 'unix:///run/server-a-admin.sock', role: 'ACTIVE', holderPid: 10 }],
    adminSockets: [{ path: '/run/server-a-admin.sock', staleSinceMs: 0 }],
    activeStartMs: 1000,
    records: [{ id: A, state: 'RUNNING', pid: 100, metadata: {} }],
    vms: [{ vmId: A, pid: 100, state: 'RUNNING' }],
    containers: [A],
    devices: [
      { deviceId: `${A}-upper`, backingFile: `/state/images/${A}-upper.img`, state: 'ATTACHED' },
      { deviceId: `${A}-ws`, backingFile: `/state/images/${A}-ws.img`, state: 'ATTACHED' },
    ],
    loopBackingFiles: [`/state/images/${A}-upper.img`, `/state/images/${A}-ws.img`],
    dirs: [A],
    processes: [
      { pid: 1, component: 'vmm-supervisor' },
      { pid: 2, component: 'ublk-manager' },
      { pid: 10, component: 'server' },
    ],
    alivePids: [100],
    unreachable: [],
  };
}
const runningA: Expectation[] = [{ id: A, states: ['RUNNING'], pid: 100, mayBeGone: false }];

describe('planActions', () => {
  test('the same seed gives the same plan; another seed another one; a longer run starts with the shorter one', () => {
    const a = planActions(1, 80);
    expect(planActions(1, 80)).toEqual(a);
    expect(planActions(2, 80)).not.toEqual(a);
    expect(planActions(1, 30)).toEqual(a.slice(0, 30));
    expect(a.map(describeAction)).toEqual(planActions(1, 80).map(describeAction));
  });

  test('a plan of a few hundred steps has every kind, kills of every component and failpoints of both sides of both handovers', () => {
    const p = planActions(7, 400);
    expect(new Set(p.map((a) => a.kind))).toEqual(new Set(['create', 'exec', 'fork', 'pause', 'resume', 'delete', 'upgrade-server', 'upgrade-ublk']));
    expect(new Set(p.flatMap((a) => (a.kill ? [a.kill.component] : [])))).toEqual(new Set(['vmm-supervisor', 'ublk-manager', 'server']));
    const fps = new Set(p.flatMap((a) => (a.failpoint ? [a.failpoint.name] : [])));
    expect(fps.size).toBeGreaterThan(8);
    for (const f of p.filter((a) => a.failpoint)) {
      expect(f.kind === 'upgrade-server' ? SERVER_HANDOVER_FAILPOINTS : UBLK_HANDOVER_FAILPOINTS).toContainEqual(f.failpoint);
    }
    expect(p.every((a) => a.step >= 1 && a.bytes >= 1 && a.bytes <= 1 << 20 && (a.kill?.delayMs ?? 0) >= 0)).toBe(true);
  });

  test('an exec payload is the same for the same seed, and the expected stdout has the planned size', () => {
    expect(payload(5, 1001)).toEqual(payload(5, 1001));
    expect(payload(5, 1001)).not.toEqual(payload(6, 1001));
    const a = { ...planActions(3, 1)[0]!, kind: 'exec' as const, bytes: 23, payloadSeed: 42 };
    expect(expectedStdout({ ...a, stdin: false }).toString()).toBe('chaos42\nchaos42\nchaos42\n'.slice(0, 23));
    expect(expectedStdout({ ...a, stdin: true })).toEqual(payload(42, 23));
  });
});

describe('checkInvariants', () => {
  test('a healthy node violates nothing', () => {
    expect(checkInvariants(healthy(), runningA)).toEqual([]);
  });

  test.each<[string, (s: NodeSnapshot) => void, RegExp]>([
    ['no active server', (s) => (s.servers[0]!.role = 'RETIRING'), /0 active servers/],
    ['two active servers', (s) => s.servers.push({ admin: 'unix:///run/server-b-admin.sock', role: 'ACTIVE', holderPid: 11 }), /2 active servers/],
    ['an admin socket already dead when the active server started', (s) => s.adminSockets.push({ path: '/run/server-99-admin.sock', staleSinceMs: 900 }), /orphan socket \/run\/server-99-admin.sock/],
    ['a second server process', (s) => s.processes.push({ pid: 11, component: 'server' }), /2 server processes/],
    ['no ublk-manager process', (s) => (s.processes = s.processes.filter((p) => p.component !== 'ublk-manager')), /0 ublk-manager processes/],
    ['a record CREATING', (s) => (s.records[0]!.state = 'CREATING'), /is CREATING \(not a resting state\)/],
    ['a running record without its VM', (s) => (s.vms = []), /has no VM/],
    ['a running record without its workspace device', (s) => s.devices.pop(), /has no device sb-00000000000000a1-ws/],
    ['a running record whose pid died', (s) => (s.alivePids = []), /pid 100 is not alive/],
    ['a running sandbox restarted with another pid', (s) => ((s.records[0]!.pid = 101), (s.vms[0]!.pid = 101), (s.alivePids = [101])), /runs with pid 101, expected 100/],
    ['a running sandbox that went to ERROR', (s) => (s.records[0]!.state = 'ERROR'), /is ERROR, expected RUNNING/],
    ['a running sandbox gone', (s) => (s.records = []), /\(RUNNING\) is gone/],
    ['an orphan VM', (s) => s.vms.push({ vmId: B, pid: 200, state: 'RUNNING' }), /orphan VM sb-00000000000000b2/],
    ['an orphan container', (s) => s.containers.push(B), /orphan container/],
    ['an orphan device', (s) => s.devices.push({ deviceId: `${B}-ws`, backingFile: '/state/images/x.img', state: 'ATTACHED' }), /orphan device/],
    ['an orphan loop device', (s) => s.loopBackingFiles.push('/state/images/gone.img'), /orphan loop device on \/state\/images\/gone.img/],
    ['a leaked loop device on the image pool file', (s) => (s.poolLoops = 2), /2 loop devices on the image pool file/],
    ['an orphan dir', (s) => s.dirs.push(B), /orphan dir sandboxes\/sb-00000000000000b2/],
    ['a component that does not answer', (s) => s.unreachable.push('ublk-manager: ListDevices: UNAVAILABLE'), /component does not answer: ublk-manager/],
  ])('finds %s', (_, spoil, want) => {
    const s = healthy();
    spoil(s);
    const v = checkInvariants(s, runningA);
    expect(v.some((x) => want.test(x))).toBe(true);
  });

  test('the admin socket of a server that died after the active one started is not (yet) an orphan: the next start removes it', () => {
    const s = healthy();
    s.adminSockets.push({ path: '/run/server-b-admin.sock', staleSinceMs: 1500 });
    expect(checkInvariants(s, runningA)).toEqual([]);
  });

  test('a failed pause may leave the sandbox paused; a failed delete may leave it gone', () => {
    const s = healthy();
    s.records[0]!.state = 'PAUSED';
    s.vms[0]!.state = 'PAUSED';
    expect(checkInvariants(s, [{ id: A, states: ['RUNNING', 'PAUSED'], pid: 100, mayBeGone: false }])).toEqual([]);
    const empty: NodeSnapshot = { ...healthy(), records: [], vms: [], containers: [], devices: [], loopBackingFiles: [], dirs: [] };
    expect(checkInvariants(empty, [{ id: A, states: ['RUNNING'], pid: 100, mayBeGone: true }])).toEqual([]);
  });
});

describe('Model', () => {
  test('a failed create whose sandbox appears is adopted; a record no call made is a violation', () => {
    const m = new Model();
    m.failedToMake('chaos-1-3');
    const s = healthy();
    s.records[0]!.metadata = { [REQUEST_KEY]: 'chaos-1-3' };
    expect(m.adopt(s)).toEqual([]);
    expect(m.expectations()).toEqual(runningA);
    const other = healthy();
    other.records.push({ id: B, state: 'RUNNING', pid: 5, metadata: { [REQUEST_KEY]: 'chaos-1-9' } });
    expect(m.adopt(other)).toEqual([expect.stringMatching(/record sb-00000000000000b2 .* that no call of this run made/)]);
  });

  test('settle narrows a sandbox of several possible states to the one it shows, and forgets one that may be gone and is', () => {
    const m = new Model();
    m.made(A, 100);
    m.made(B, 200);
    m.maybe(A, ['RUNNING', 'PAUSED']);
    m.maybe(B, [], true);
    const s = healthy();
    s.records[0]!.state = 'PAUSED';
    m.settle(s);
    expect(m.expectations()).toEqual([{ id: A, states: ['PAUSED'], pid: 100, mayBeGone: false }]);
    expect(m.inState('PAUSED')).toEqual([A]);
    expect(m.inState('RUNNING')).toEqual([]);
  });
});
