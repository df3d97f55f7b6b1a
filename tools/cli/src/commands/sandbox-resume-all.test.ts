import { ClientError, Status } from 'nice-grpc-common';
import { Sandbox, SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { resumeAllDrained, resumeAllText } from './sandbox';

/** A fake node: `drained` sandboxes (ids; `hib` ones hibernated), resumes of `failing` ids fail; counts the resumes at once. */
function fakeApi(drained: string[], hib: string[] = [], failing: string[] = []) {
  let inFlight = 0;
  let most = 0;
  const asked: string[] = [];
  const sb = (id: string, state: SandboxState) => Sandbox.fromPartial({ sandboxId: id, state, idle: { hibernated: hib.includes(id) } });
  const api = {
    sandboxes: {
      listSandboxes: async (req: { states: SandboxState[]; pageToken: string }) => {
        expect(req.states).toEqual([SandboxState.SANDBOX_STATE_DRAINED]);
        // two pages, as a node with many gives them
        const half = Math.ceil(drained.length / 2);
        const page = req.pageToken === '' ? drained.slice(0, half) : drained.slice(half);
        return { sandboxes: page.map((id) => sb(id, SandboxState.SANDBOX_STATE_DRAINED)), nextPageToken: req.pageToken === '' && drained.length > half ? 'p2' : '' };
      },
      resumeSandbox: async ({ sandboxId }: { sandboxId: string }) => {
        asked.push(sandboxId);
        most = Math.max(most, ++inFlight);
        await new Promise((r) => setTimeout(r, 5));
        inFlight--;
        if (failing.includes(sandboxId)) throw new ClientError('/x/ResumeSandbox', Status.FAILED_PRECONDITION, `sandbox ${sandboxId}: its disks are gone`);
        return { sandbox: sb(sandboxId, SandboxState.SANDBOX_STATE_RUNNING) };
      },
    },
  };
  return { api: api as never, asked, most: () => most };
}

describe('sandbox resume --all-drained', () => {
  it('resumes every DRAINED sandbox of every page, 4 at a time, and leaves the hibernated ones (newcomer: a loop by hand)', async () => {
    const ids = Array.from({ length: 10 }, (_, i) => `sb-${i}`);
    const f = fakeApi(ids, ['sb-3']);
    const r = await resumeAllDrained(f.api);
    expect(f.asked.sort()).toEqual(ids.filter((x) => x !== 'sb-3').sort());
    expect(f.most()).toBe(4);
    expect(r.resumed.map((s) => s.id).sort()).toEqual(f.asked.sort());
    expect(r.hibernated).toEqual(['sb-3']);
    expect(resumeAllText(r)).toMatch(/resumed 9 of 9 drained sandboxes; 1 hibernated left as they are/);
  });

  it('a resume that fails is reported with its code; the others go on', async () => {
    const f = fakeApi(['sb-a', 'sb-b', 'sb-c'], [], ['sb-b']);
    const r = await resumeAllDrained(f.api);
    expect(r.resumed.map((s) => s.id).sort()).toEqual(['sb-a', 'sb-c']);
    expect(r.failed).toEqual([{ id: 'sb-b', error: 'FAILED_PRECONDITION: sandbox sb-b: its disks are gone' }]);
    expect(resumeAllText(r)).toMatch(/sb-b: resume failed: FAILED_PRECONDITION[^\n]*\n.*resumed 2 of 3 drained sandboxes$/s);
  });

  it('nothing drained: nothing asked', async () => {
    const f = fakeApi([]);
    expect(await resumeAllDrained(f.api)).toEqual({ resumed: [], failed: [], hibernated: [] });
    expect(f.asked).toEqual([]);
  });
});
