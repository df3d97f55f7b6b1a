/** `up`'s hint when the node's defaults are held elsewhere: it names what is held and gives the second-node settings the README gives. */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { SECOND_NODE_ENV, secondNodeHint } from './node';

describe('secondNodeHint', () => {
  test('names what is held and the variables of a second node', () => {
    expect(secondNodeHint(['the ingress port'])).toMatch(/^the ingress port of this node is held elsewhere \(often another sandnode node on the defaults\)\. /);
    const many = secondNodeHint(['the network pool', 'the ingress port', 'the server metrics port']);
    expect(many).toMatch(/^the network pool, the ingress port, the server metrics port of this node are held elsewhere/);
    for (const v of ['SANDNODE_VMM_SUPERVISOR_NETWORK_POOL=', 'SANDNODE_SERVER_INGRESS_LISTEN=', 'SANDNODE_SERVER_METRICS_LISTEN=', 'SANDNODE_VMM_SUPERVISOR_DNS_PORT=']) expect(many).toContain(v);
    expect(many).toContain('README: "A second node beside the first"');
  });
  test('the settings are the ones README shows, in the section the hint names', () => {
    const readme = readFileSync(path.resolve(__dirname, '../../../../README.md'), 'utf8').replace(/\s+/g, ' ');
    expect(readme).toContain('A second node beside the first');
    expect(readme).toContain(SECOND_NODE_ENV);
  });
});
