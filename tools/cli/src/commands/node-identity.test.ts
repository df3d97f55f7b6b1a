/** `sandnode status`'s node line: the id the components agree on, or every disagreement named. */
import { nodeIdentity } from './node';

describe('nodeIdentity', () => {
  it('one id when the components agree; older builds (no id) and components that are down do not count', () => {
    expect(
      nodeIdentity([
        { name: 'vmm-supervisor', nodeId: 'n1' },
        { name: 'ublk-manager', nodeId: null },
        { name: 'server', nodeId: 'n1' },
      ]),
    ).toEqual({ nodeId: 'n1', text: 'node: n1' });
    expect(nodeIdentity([{ name: 'server', nodeId: null }])).toEqual({ nodeId: null, text: 'node: unknown (no component reports a node id)' });
  });

  it('with every component down: the id kept in the state dir, said as such (before: unknown)', () => {
    expect(nodeIdentity([{ name: 'server', nodeId: null }], 'node-0123456789abcdef')).toEqual({
      nodeId: 'node-0123456789abcdef',
      text: 'node: node-0123456789abcdef (kept in <stateDir>/node-id; no component is up to report it)',
    });
    // a component that answers wins over the file
    expect(nodeIdentity([{ name: 'server', nodeId: 'n1' }], 'node-old').nodeId).toBe('n1');
  });

  it("names every component when they disagree, and takes the server's as the node's", () => {
    const r = nodeIdentity([
      { name: 'vmm-supervisor', nodeId: 'a' },
      { name: 'server', nodeId: 'b' },
    ]);
    expect(r.nodeId).toBe('b');
    expect(r.text).toBe('node: b; MISMATCH: vmm-supervisor says a, server says b (check SANDNODE_NODE_ID and <stateDir>/node-id)');
  });
});
