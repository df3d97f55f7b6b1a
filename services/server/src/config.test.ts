/** The server's config (issue 10 §4): TCP is off unless `listen` is set. */
import { loadServerConfig } from './config';
import { checkApiAccess } from './handover/api-access';

describe('loadServerConfig: who can reach the API', () => {
  it('serves no TCP by default: the unix socket is the API', () => {
    const c = loadServerConfig({ env: {} });
    expect(c.listen).toBe('');
    expect(c.socketGroup).toBe('');
    expect(c.socket.endsWith('/server.sock')).toBe(true);
  });
});

describe('loadServerConfig: a TCP listener needs credentials', () => {
  const load = (env: Record<string, string>) => () => loadServerConfig({ env });
  it('plaintext TCP only on a loopback host (then with bearer tokens)', () => {
    for (const listen of ['127.0.0.1:7070', 'localhost:0', '[::1]:7070']) expect(load({ SANDNODE_SERVER_LISTEN: listen })().listen).toBe(listen);
    for (const listen of ['0.0.0.0:7070', '10.1.2.3:7070', '[::]:7070', ':7070'])
      expect(load({ SANDNODE_SERVER_LISTEN: listen })).toThrow(/^listen: .*not a loopback address.*tlsCa, tlsCert and tlsKey/);
  });
  it('TLS keys go together; with them any host may be listened on', () => {
    expect(load({ SANDNODE_SERVER_LISTEN: '0.0.0.0:7070', SANDNODE_SERVER_TLS_CERT: '/c.pem', SANDNODE_SERVER_TLS_KEY: '/k.pem' })).toThrow(/^tlsCa: /);
    expect(load({ SANDNODE_SERVER_TLS_CA: '/ca.pem' })).toThrow(/^tlsCert: .*missing: tlsCert, tlsKey/);
    expect(load({ SANDNODE_SERVER_LISTEN: '0.0.0.0:7070', SANDNODE_SERVER_TLS_CA: '/ca.pem', SANDNODE_SERVER_TLS_CERT: '/c.pem', SANDNODE_SERVER_TLS_KEY: '/k.pem' })().tlsCert).toBe('/c.pem');
  });
});

describe('checkApiAccess: read at start, so a bad file or group stops the start naming the key', () => {
  it('names the key of a TLS file that cannot be read, and a group that does not exist', () => {
    const base = { listen: '0.0.0.0:7070', socketGroup: '', tlsCa: '/nonexistent/ca.pem', tlsCert: '/nonexistent/c.pem', tlsKey: '/nonexistent/k.pem' };
    expect(() => checkApiAccess(base)).toThrow(/^tlsCa: cannot read \/nonexistent\/ca.pem/);
    expect(() => checkApiAccess({ ...base, listen: '', tlsCert: '', socketGroup: 'no-such-group-here' })).toThrow(/^socketGroup: there is no group "no-such-group-here"/);
    expect(() => checkApiAccess({ ...base, listen: '', tlsCert: '', socketGroup: 'root' })).not.toThrow();
  });
});

describe('loadServerConfig: ingress keys', () => {
  it('defaults: 127.0.0.1:8480 on localhost; "" turns it off; a bad address or domain names the key', () => {
    const d = loadServerConfig({ env: {} });
    expect(d.ingressListen).toBe('127.0.0.1:8480');
    expect(d.ingressDomain).toBe('localhost');
    expect(d.ingressMaxConnectionsPerSandbox).toBe(512);
    expect(loadServerConfig({ env: { SANDNODE_SERVER_INGRESS_LISTEN: '' } }).ingressListen).toBe('');
    expect(loadServerConfig({ env: { SANDNODE_SERVER_INGRESS_LISTEN: '[::1]:80', SANDNODE_SERVER_INGRESS_DOMAIN: 'sb.example.com' } })).toMatchObject({
      ingressListen: '[::1]:80',
      ingressDomain: 'sb.example.com',
    });
    expect(() => loadServerConfig({ env: { SANDNODE_SERVER_INGRESS_LISTEN: '8480' } })).toThrow(/ingressListen/);
    expect(() => loadServerConfig({ env: { SANDNODE_SERVER_INGRESS_DOMAIN: 'bad domain' } })).toThrow(/ingressDomain/);
  });
  it('ingressEngine: raw by default, node-http selectable, anything else refused naming the key', () => {
    expect(loadServerConfig({ env: {} }).ingressEngine).toBe('raw');
    expect(loadServerConfig({ env: { SANDNODE_SERVER_INGRESS_ENGINE: 'node-http' } }).ingressEngine).toBe('node-http');
    expect(() => loadServerConfig({ env: { SANDNODE_SERVER_INGRESS_ENGINE: 'nginx' } })).toThrow(/ingressEngine/);
  });
});

describe('loadServerConfig: /metrics', () => {
  it('serves /metrics on 127.0.0.1:9464 by default; "" turns it off; anything but host:port is refused naming the key', () => {
    expect(loadServerConfig({ env: {} }).metricsListen).toBe('127.0.0.1:9464');
    expect(loadServerConfig({ env: { SANDNODE_SERVER_METRICS_LISTEN: '' } }).metricsListen).toBe('');
    expect(loadServerConfig({ env: { SANDNODE_SERVER_METRICS_LISTEN: '127.0.0.1:19464' } }).metricsListen).toBe('127.0.0.1:19464');
    expect(() => loadServerConfig({ env: { SANDNODE_SERVER_METRICS_LISTEN: '9464' } })).toThrow(/metricsListen/);
  });
});
