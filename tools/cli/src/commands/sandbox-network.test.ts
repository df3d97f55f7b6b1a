/**
 * The network flags of `sandbox create`/`fork`, `sandbox network` and `sandbox url` as parsed
 * (no node): what request each line makes, and the usage errors (exit 2) of flags that do not
 * go together.
 */
import { Command } from 'commander';
import { SandboxNetwork } from '@sandnode/shared/proto/server/v1/sandbox';
import { sandboxJson } from '@sandnode/node-stack';
import { CliError, UsageError } from '../output';
import { previewText } from './upgrade';
import { addNetworkFlags, allowOutNote, headerForm, networkChange, type NetworkFlags, networkLine, networkRequest, networkText, tokenText, urlOf } from './sandbox-network';

/** parse runs a throwaway command with the network flags over argv and returns its options. */
function parse(argv: string[], extra: (c: Command) => Command = (c) => c): NetworkFlags & { private?: boolean } {
  const c = extra(addNetworkFlags(new Command('create').exitOverride()));
  c.parse(argv, { from: 'user' });
  return c.opts();
}

describe('sandbox create network flags', () => {
  it('no flag leaves network unset (the node decides)', () => {
    expect(networkRequest(parse([]))).toBeUndefined();
  });

  it('--allow-out and --deny-out repeat, --block-all and --public set theirs', () => {
    expect(networkRequest(parse(['--allow-out', 'pypi.org', '--allow-out', '*.pythonhosted.org', '--deny-out', '203.0.113.0/24', '--block-all', '--public']))).toEqual({
      disabled: false,
      egress: { allowOut: ['pypi.org', '*.pythonhosted.org'], denyOut: ['203.0.113.0/24'], blockAll: true },
      public: true,
    });
    expect(networkRequest(parse(['--public']))).toEqual({ disabled: false, egress: undefined, public: true });
  });

  it('--no-network asks for none; with a policy flag or --public it is a usage error', () => {
    expect(networkRequest(parse(['--no-network']))).toEqual({ disabled: true, egress: undefined, public: false });
    expect(() => networkRequest(parse(['--no-network', '--allow-out', 'example.com']))).toThrow(UsageError);
    expect(() => networkRequest(parse(['--no-network', '--public']))).toThrow(/--no-network cannot go with/);
  });

  it('the token line says it is shown once and names the header; none without a token', () => {
    expect(tokenText('abc')).toBe('access token abc (shown only now; send it as header sandnode-access-token: for its ingress)');
    expect(tokenText('')).toBe('');
    // a repeat by request_id gives the first create's token again: not "shown only now"
    expect(tokenText('abc', true)).toBe('access token abc (the one the first create gave; send it as header sandnode-access-token: for its ingress)');
    // a public sandbox's ingress takes no token: said so (newcomer: "send it as header" read as needed)
    expect(tokenText('abc', false, true)).toBe(
      'access token abc (shown only now; not needed while the sandbox is public; send it as header sandnode-access-token: once `sandbox network ID --private` makes it private)',
    );
  });
});

describe('sandbox network', () => {
  const withPrivate = (c: Command) => c.option('--private');

  it('without flags shows; --public/--private alone keep the policy; a policy flag replaces it', () => {
    expect(networkChange(parse([], withPrivate))).toBeUndefined();
    expect(networkChange(parse(['--private'], withPrivate))).toEqual({ public: false });
    expect(networkChange(parse(['--block-all', '--allow-out', 'example.com'], withPrivate))).toEqual({ egress: { allowOut: ['example.com'], denyOut: [], blockAll: true }, public: undefined });
    expect(() => networkChange(parse(['--public', '--private'], withPrivate))).toThrow(/one of --public and --private/);
  });

  it('shows a network from its proto JSON mapping, and says when there is none', () => {
    const n = SandboxNetwork.fromPartial({
      slot: 0,
      address: '10.209.0.2',
      gateway: '10.209.0.1',
      egress: { allowOut: ['example.com'], denyOut: [], blockAll: true },
      public: false,
      ingressUrl: 'http://{port}-sb-1.localhost:8480',
    });
    const j = sandboxJson({ sandboxId: 'sb-1', state: 2, isolation: [], metadata: {}, envKeys: [], createdAtMs: 0, network: n } as never);
    // slot 0 is kept (the proto JSON mapping would leave it out)
    expect(j.network).toEqual({ slot: 0, address: '10.209.0.2', gateway: '10.209.0.1', egress: { allowOut: ['example.com'], blockAll: true }, ingressUrl: 'http://{port}-sb-1.localhost:8480' });
    expect(networkText(j.network)).toMatch(/^slot {10}0\naddress {7}10\.209\.0\.2\n.*allow out {5}example\.com\n.*block all {5}yes\ningress {7}private/s);
    expect(networkText(null)).toBe('no network');
  });
});

describe('sandbox url', () => {
  it('fills the port in; a bad port or a sandbox without ingress is a usage error', () => {
    expect(urlOf('sb-1', 'http://{port}-sb-1.localhost:8480', '8080')).toBe('http://8080-sb-1.localhost:8480');
    expect(() => urlOf('sb-1', 'http://{port}-sb-1.localhost:8480', '0')).toThrow(/is not 1\.\.65535/);
    expect(() => urlOf('sb-1', 'http://{port}-sb-1.localhost:8480', '65536')).toThrow(UsageError);
    expect(() => urlOf('sb-1', 'http://{port}-sb-1.localhost:8480', '80a')).toThrow(UsageError);
    expect(() => urlOf('sb-1', '', '8080')).toThrow(/has no ingress URL/);
    // a sandbox without one is a failure (exit 1), not a wrong command line (exit 2: newcomer)
    expect(() => urlOf('sb-1', '', '8080')).toThrow(CliError);
    expect(() => urlOf('sb-1', '', '8080')).not.toThrow(UsageError);
  });
  test('headerForm: the 127.0.0.1 listener and the routing headers for a *.localhost URL (glibc does not resolve those); none for another domain', () => {
    expect(headerForm('sb-1', 'http://8080-sb-1.localhost:8480', 8080)).toEqual({ url: 'http://127.0.0.1:8480/', headers: { 'sandnode-sandbox-id': 'sb-1', 'sandnode-sandbox-port': '8080' } });
    expect(headerForm('sb-1', 'http://8080-sb-1.sandbox.example.com:8480', 8080)).toBeUndefined();
    expect(headerForm('sb-1', 'not a url', 8080)).toBeUndefined();
  });
});

describe('upgrade server --dry-run text', () => {
  it('says whether the handover would start and each loss', () => {
    const p = { ok: true, reasons: [], losses: ['the standby (0.2.0) lacks "server.ingress.v1": ...'], sandboxes: 3, inFlight: 0, fromVersion: '0.3.0', toVersion: '0.2.0' };
    expect(previewText(p)).toBe('a handover from 0.3.0 to 0.2.0 would start now (3 live sandboxes adopted)\nloses: the standby (0.2.0) lacks "server.ingress.v1": ...');
    expect(previewText({ ...p, ok: false, reasons: ['this server is STANDBY, not ACTIVE'], losses: [] })).toBe(
      'a handover from 0.3.0 to 0.2.0 would not start: this server is STANDBY, not ACTIVE\nloses: nothing the target lacks',
    );
  });
});

describe('the network line of create and fork', () => {
  it('names the address, gateway and ingress URL, or says there is none', () => {
    const n = SandboxNetwork.fromPartial({ slot: 1, address: '10.209.0.6', gateway: '10.209.0.5', public: true, ingressUrl: 'http://{port}-sb-1.localhost:8480' });
    const j = sandboxJson({ sandboxId: 'sb-1', state: 2, isolation: [], metadata: {}, envKeys: [], createdAtMs: 0, network: n } as never);
    expect(networkLine(j.network)).toBe('network 10.209.0.6 (gateway 10.209.0.5), ingress http://{port}-sb-1.localhost:8480 (public)');
    expect(networkLine(null)).toBe('no network (loopback only)');
  });
});

describe('allowOutNote', () => {
  it('notes an --allow-out that changes nothing: no --block-all and no --deny-out to lift (newcomer)', () => {
    expect(allowOutNote({ allowOut: ['8.8.8.8/32'], denyOut: [], blockAll: false })).toMatch(/^sandnode: note: --allow-out changes nothing without --block-all/);
  });
  it('says nothing when it does something, or when there is none', () => {
    expect(allowOutNote({ allowOut: ['8.8.8.8/32'], denyOut: [], blockAll: true })).toBeUndefined();
    expect(allowOutNote({ allowOut: ['8.8.8.8/32'], denyOut: ['8.8.0.0/16'], blockAll: false })).toBeUndefined();
    expect(allowOutNote({ allowOut: [], denyOut: [], blockAll: false })).toBeUndefined();
  });
});
