/** loopbackView: the network directory's view of one sandbox at 127.0.0.1, for unit tests of the resolver and the proxies (no netns). */
import { parseEgressPolicy, type EgressPolicyInput } from '@sandnode/shared';
import type { SandboxNetworkView } from '../../core/network-directory';

/** loopbackView is RUNNING sandbox sb-1 at 127.0.0.1 (slot 0, not public, no token, no podd) whose egress policy is `p` over the defaults (nothing allowed or denied, block_all off). */
export function loopbackView(p: Partial<EgressPolicyInput>): SandboxNetworkView {
  return {
    sandboxId: 'sb-1',
    state: 'RUNNING' as SandboxNetworkView['state'],
    slot: 0,
    address: '127.0.0.1',
    gateway: '127.0.0.1',
    policy: parseEgressPolicy({ allowOut: [], denyOut: [], blockAll: false, ...p }),
    public: false,
    accessTokenSha256: '',
    poddAddress: '',
  };
}
