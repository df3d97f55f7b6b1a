import { headerArgs, parseCurl, parseWrk } from './network-load';

// wrk 4.1.0's report (Debian 12), as printed against a local server
const WRK_OK = `Running 1s test @ http://127.0.0.1:18777/
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.94ms    2.43ms  14.88ms   75.38%
    Req/Sec   489.90    157.24   840.00     80.00%
  489 requests in 1.00s, 768.84KB read
Requests/sec:    487.39
Transfer/sec:    766.31KB
`;

describe('parseWrk', () => {
  it("reads wrk's requests/s", () => {
    expect(parseWrk('direct', WRK_OK)).toBe(487.39);
  });

  it('refuses a run with non-2xx answers or socket errors: a figure counts answered requests only', () => {
    const bad = WRK_OK.replace('Requests/sec', '  Non-2xx or 3xx responses: 450\nRequests/sec');
    expect(() => parseWrk('ingress', bad)).toThrow('ingress: wrk: 450 answers were not 2xx/3xx');
    const cut = WRK_OK.replace('Requests/sec', '  Socket errors: connect 0, read 2, write 0, timeout 0\nRequests/sec');
    expect(() => parseWrk('nginx', cut)).toThrow('nginx: wrk: socket errors connect 0, read 2, write 0, timeout 0');
  });

  it('refuses a report without the figure', () => {
    expect(() => parseWrk('direct', 'unable to connect to 127.0.0.1:18779 Connection refused\n')).toThrow('wrk printed no Requests/sec');
  });
});

describe('parseCurl', () => {
  it('gives MiB/s of a whole 200 download', () => {
    expect(parseCurl('direct', '200 268435456 0.5', 268435456)).toBe(512);
  });

  it('refuses another status or a short body', () => {
    expect(() => parseCurl('ingress', '401 0 0.001', 1024)).toThrow('ingress: download got 401, 0 of 1024 bytes');
    expect(() => parseCurl('ingress', '200 1000 0.01', 1024)).toThrow('got 200, 1000 of 1024 bytes');
  });
});

describe('headerArgs', () => {
  it('spells Host so that wrk replaces its own (a second Host is a bad request)', () => {
    expect(headerArgs({ name: 'ingress', host: '127.0.0.1', port: 1, headers: { host: '8080-sb.localhost', 'sandnode-access-token': 't' } })).toEqual([
      '-H',
      'Host: 8080-sb.localhost',
      '-H',
      'sandnode-access-token: t',
    ]);
  });
});
