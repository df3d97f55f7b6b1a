import { InvalidArgumentError } from './errors';
import { DEFAULT_ALWAYS_DENIED, evaluateEgress, unreachableAllows, formatEgressPolicy, nameAllowed, parseCidr, parseCidrList, parseDomainRule, parseEgressPolicy } from './egress-policy';

const denied = parseCidrList(DEFAULT_ALWAYS_DENIED, 'alwaysDenied');
const policy = (allowOut: string[] = [], denyOut: string[] = [], blockAll = false) => parseEgressPolicy({ allowOut, denyOut, blockAll });

describe('egress policy', () => {
  test('parses and canonicalises entries; equal policies format equal', () => {
    const p = policy(['Example.COM.', '*.api.example.com', '198.51.100.7', '198.51.100.0/24', '198.51.100.7'], ['203.0.113.0/24']);
    expect(formatEgressPolicy(p)).toEqual({ allowOut: ['198.51.100.0/24', '198.51.100.7/32', '*.api.example.com', 'example.com'], denyOut: ['203.0.113.0/24'], blockAll: false });
  });

  test.each([
    ['10.1.2.3/8', /host bits set; the network is 10.0.0.0\/8/],
    ['1.2.3.4/33', /prefix length/],
    ['01.2.3.4', /not a domain|not an IPv4/],
    ['::1', /IPv6/],
    ['*', /not a domain/],
    ['a..b', /not a domain/],
    ['foo.*.com', /not a domain/],
    ['1.2.3', /not an IPv4|not a domain/],
    ['', /empty/],
  ])('allow_out %p is INVALID_ARGUMENT naming the entry', (entry, why) => {
    expect(() => policy([entry])).toThrow(InvalidArgumentError);
    expect(() => policy([entry])).toThrow(why);
    expect(() => policy([entry])).toThrow('egress.allow_out[0]');
  });

  test('deny_out refuses domains and more than 256 entries', () => {
    expect(() => policy([], ['example.com'])).toThrow(/deny_out\[0\].*is a domain/);
    expect(() =>
      policy(
        [],
        Array.from({ length: 257 }, (_, i) => `198.51.${i >> 8}.${i & 255}`),
      ),
    ).toThrow(/at most 256/);
  });

  test('always-denied beats allow; allow beats deny and block_all; default allows', () => {
    const p = policy(['10.0.0.5', 'ok.example.com', '198.51.100.0/24'], ['198.51.0.0/16']);
    expect(evaluateEgress(p, denied, '10.0.0.5')).toEqual({ allowed: false, rule: 'always-denied 10.0.0.0/8' });
    expect(evaluateEgress(p, denied, '169.254.169.254', 'ok.example.com')).toEqual({ allowed: false, rule: 'always-denied 169.254.0.0/16' });
    expect(evaluateEgress(p, denied, '198.51.100.9')).toEqual({ allowed: true, rule: 'allow_out 198.51.100.0/24' });
    expect(evaluateEgress(p, denied, '198.51.7.1')).toEqual({ allowed: false, rule: 'deny_out 198.51.0.0/16' });
    expect(evaluateEgress(p, denied, '198.51.7.1', 'OK.example.com:443')).toEqual({ allowed: true, rule: 'allow_out ok.example.com' });
    expect(evaluateEgress(p, denied, '203.0.113.1')).toEqual({ allowed: true, rule: 'default' });
    const closed = policy(['*.example.com'], [], true);
    expect(evaluateEgress(closed, denied, '203.0.113.1', 'example.com')).toEqual({ allowed: false, rule: 'block_all' });
    expect(evaluateEgress(closed, denied, '203.0.113.1', 'a.b.example.com')).toEqual({ allowed: true, rule: 'allow_out *.example.com' });
    expect(evaluateEgress(closed, denied, '203.0.113.1', 'evilexample.com').allowed).toBe(false);
  });

  test('the resolver answers only allowed names under block_all', () => {
    const closed = policy(['example.com'], [], true);
    expect(nameAllowed(closed, 'EXAMPLE.com.').allowed).toBe(true);
    expect(nameAllowed(closed, 'other.com').allowed).toBe(false);
    expect(nameAllowed(policy(), 'other.com').allowed).toBe(true);
  });

  test('parseCidr and parseDomainRule', () => {
    expect(parseCidr('198.18.0.0/15').text).toBe('198.18.0.0/15');
    expect(parseDomainRule('*.Example.com').text).toBe('*.example.com');
    expect(() => parseDomainRule('example.123')).toThrow(/all-numeric/);
  });
});

describe('unreachableAllows', () => {
  it('lists allow_out CIDRs wholly inside an always-denied range, not those that only overlap one', () => {
    const p = parseEgressPolicy({ allowOut: ['10.1.2.3', '172.16.0.0/12', '0.0.0.0/0', '8.8.8.8', '192.168.0.0/15', 'example.com'], denyOut: [], blockAll: true });
    expect(unreachableAllows(p, denied)).toEqual([
      { allow: '10.1.2.3/32', deniedBy: '10.0.0.0/8' },
      { allow: '172.16.0.0/12', deniedBy: '172.16.0.0/12' },
    ]);
  });
});
