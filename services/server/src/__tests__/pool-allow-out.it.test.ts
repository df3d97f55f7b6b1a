/**
 * Newcomer finding (fixed): an --allow-out CIDR wholly inside an always-denied range (README
 * "Networking": refused INVALID_ARGUMENT naming the range) is refused by a cold create and by
 * UpdateSandboxNetwork, and a create served from the warm pool took it (pool-claim.ts set
 * the request's policy with setVmEgress and never called checkAllowsReachable): the answer was
 * a RUNNING sandbox whose allow entry could never work. Both paths refuse alike.
 */
import { Status } from 'nice-grpc-common';
import { describeNode, startNode, type TestNode } from '@sandnode/testkit';
import { setPool, waitReady } from './pool-helpers';

jest.setTimeout(300_000);

const unreachable = { allowOut: ['10.1.0.0/16'], denyOut: [], blockAll: true };

describeNode('warm pool claim and always-denied allow_out', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode({ network: true });
  });
  afterAll(async () => {
    await node?.stop();
  });

  test('a cold create refuses an allow_out inside 10.0.0.0/8 (the documented behaviour)', async () => {
    await expect(node.api.sandboxes.createSandbox({ template: 'base', network: { disabled: false, egress: unreachable, public: false } })).rejects.toMatchObject({
      code: Status.INVALID_ARGUMENT,
    });
  });

  test('a create served from the warm pool refuses it too, and the member stays in the pool', async () => {
    await setPool(node, { template: 'base', size: 1 });
    await waitReady(node, 'base', 1);
    let made: string | undefined;
    try {
      const p = node.api.sandboxes.createSandbox({ template: 'base', network: { disabled: false, egress: unreachable, public: false } }).then((r) => {
        made = r.sandbox?.sandboxId;
        return r;
      });
      await expect(p).rejects.toMatchObject({ code: Status.INVALID_ARGUMENT, details: expect.stringContaining('10.1.0.0/16 (inside 10.0.0.0/8)') });
      // refused before a member was taken: the pool still holds it
      await waitReady(node, 'base', 1);
    } finally {
      if (made) await node.api.sandboxes.deleteSandbox({ sandboxId: made });
      await setPool(node, { template: 'base', size: 0 });
    }
  });
});
