/**
 * An ExecStream across a server handover (`upgrade server`): the stream opened on the old server
 * stays there and keeps relaying both ways to its end (stdin sent after the handover reaches the
 * command, its output comes back); a client that then connects to the new server lists the
 * command and, once the old stream went away, attaches to it by exec_id and gets the output
 * produced meanwhile.
 */
import type { ExecStreamRequest, ExecStreamResponse } from '@sandnode/shared/proto/server/v1/sandbox';
import { upgradeServer } from '@sandnode/node-stack';
import { describeNode, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

/** feed is a request stream: the first request, then what push() is given, until end(). */
function feed(first: ExecStreamRequest) {
  const items: ExecStreamRequest[] = [first];
  let wake: (() => void) | undefined;
  let ended = false;
  return {
    push(r: ExecStreamRequest['input']) {
      items.push({ input: r });
      wake?.();
    },
    end() {
      ended = true;
      wake?.();
    },
    async *[Symbol.asyncIterator](): AsyncIterator<ExecStreamRequest> {
      for (;;) {
        const r = items.shift();
        if (r) {
          yield r;
          continue;
        }
        if (ended) return;
        await new Promise<void>((resolve) => (wake = resolve));
        wake = undefined;
      }
    },
  };
}

const text = (evs: ExecStreamResponse[]) => Buffer.concat(evs.flatMap((e) => (e.event?.$case === 'stdout' ? [Buffer.from(e.event.value)] : []))).toString();

describeNode('ExecStream across a server handover', () => {
  let node: TestNode;
  let id: string;
  beforeAll(async () => {
    node = await startNode();
    id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('the held stream relays stdin and output after the handover; the new server lists it and attaches after the old stream went away', async () => {
    const oldApi = node.api;
    const req = feed({
      input: {
        $case: 'start',
        value: { sandboxId: id, argv: ['sh', '-c', 'while read l; do echo "got $l"; done; echo bye'], env: {}, cwd: '', timeoutMs: 0, pty: false, size: undefined, detachKeepMs: 0 },
      },
    });
    const evs: ExecStreamResponse[] = [];
    const ac = new AbortController();
    let error: unknown;
    const done = (async () => {
      try {
        for await (const ev of oldApi.sandboxes.execStream(req, { signal: ac.signal })) evs.push(ev);
      } catch (err) {
        error = err;
      }
    })();
    req.push({ $case: 'stdin', value: Buffer.from('before\n') });
    await waitFor('the line before the handover', () => text(evs) === 'got before\n', 30_000);
    const u = await upgradeServer(node.dirs, '.');
    expect(u.newPid).not.toBe(u.oldPid);

    // the same stream, on the retiring server
    req.push({ $case: 'stdin', value: Buffer.from('after\n') });
    await waitFor('the line after the handover', () => text(evs) === 'got before\ngot after\n', 30_000);
    const started = evs[0]?.event?.$case === 'started' ? evs[0].event.value : undefined;
    expect(started?.execId).toMatch(/^ex-/);

    // a fresh connection reaches the new server, which sees the command through podd
    const api = node.reconnect();
    const listed = (await api.sandboxes.listProcesses({ sandboxId: id })).processes.find((p) => p.execId === started!.execId);
    expect(listed).toMatchObject({ running: true, attached: true, pid: started!.pid });

    // the old client goes away; the command runs on; the new server attaches to it
    ac.abort();
    await done;
    expect(error).toBeDefined();
    await waitFor('detached', async () => (await api.sandboxes.listProcesses({ sandboxId: id })).processes.find((p) => p.execId === started!.execId && !p.attached));
    const again = feed({ input: { $case: 'attach', value: { sandboxId: id, execId: started!.execId } } });
    const evs2: ExecStreamResponse[] = [];
    const done2 = (async () => {
      for await (const ev of api.sandboxes.execStream(again)) evs2.push(ev);
    })();
    again.push({ $case: 'stdin', value: Buffer.from('third\n') });
    again.push({ $case: 'closeStdin', value: true });
    await done2;
    again.end();
    expect(text(evs2)).toBe('got third\nbye\n');
    expect(evs2.at(-1)?.event).toMatchObject({ $case: 'exit', value: { exitCode: 0, signal: '' } });
    req.end();
  });
});
