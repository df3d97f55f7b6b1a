import { SandboxState, type Sandbox } from '@sandnode/shared/proto/server/v1/sandbox';
import { isolationGroups } from './isolation-groups';

const sb = (id: string, isolation: string[]) => ({ sandboxId: id, isolation }) as unknown as Sandbox;

describe('isolationGroups', () => {
  test('groups by the isolation list (order-insensitive), largest group first; an empty list (0.2.0 supervisor) is its own group', () => {
    const full = ['vmm.cgroup-ns.v1', 'vmm.pids-limit.v1', 'vmm.seccomp.v1'];
    expect(isolationGroups([sb('sb-b', full), sb('sb-old', []), sb('sb-a', [...full].reverse())])).toEqual([
      { isolation: full, sandboxes: ['sb-a', 'sb-b'] },
      { isolation: [], sandboxes: ['sb-old'] },
    ]);
  });
});

// newcomer: a DRAINED sandbox (no VM) of this release was shown as one without isolation
describe('isolationGroups and DRAINED sandboxes', () => {
  it('leaves them out: they have no VM to show the isolation of', () => {
    const drained = { sandboxId: 'sb-d', isolation: [], state: SandboxState.SANDBOX_STATE_DRAINED } as unknown as Sandbox;
    const running = { sandboxId: 'sb-r', isolation: ['vmm.seccomp.v1'], state: SandboxState.SANDBOX_STATE_RUNNING } as unknown as Sandbox;
    expect(isolationGroups([drained, running])).toEqual([{ isolation: ['vmm.seccomp.v1'], sandboxes: ['sb-r'] }]);
  });
});
