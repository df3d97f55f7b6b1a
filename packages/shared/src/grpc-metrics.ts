/**
 * gRPC metrics with go-grpc-prometheus's names, labels and units, for every server
 * (createServiceServer) and client (createServiceClient) of a sandnode process:
 *
 *   grpc_server_started_total{grpc_type,grpc_service,grpc_method}
 *   grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}
 *   grpc_server_handling_seconds{grpc_type,grpc_service,grpc_method}   (histogram)
 *   grpc_client_started_total / grpc_client_handled_total / grpc_client_handling_seconds (same labels)
 *
 * grpc_type is unary | client_stream | server_stream | bidi_stream; grpc_code is the status
 * name (OK, NOT_FOUND, ...). A server call is counted once per call; a client call once per
 * attempt the retry middleware makes (the middleware sits below retries).
 */
import { ClientError, Status } from 'nice-grpc-common';
import type { ClientMiddleware, MethodDescriptor } from 'nice-grpc-common';
import { Counter, Histogram } from 'prom-client';
import { registry } from './metrics';

/** Buckets of the handling-time histograms, seconds. */
export const GRPC_HANDLING_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

const LABELS = ['grpc_type', 'grpc_service', 'grpc_method'] as const;
const CODE_LABELS = [...LABELS, 'grpc_code'] as const;

const serverStarted = new Counter({ name: 'grpc_server_started_total', help: 'RPCs started on the server', labelNames: LABELS, registers: [registry] });
const serverHandled = new Counter({ name: 'grpc_server_handled_total', help: 'RPCs completed on the server, by status code', labelNames: CODE_LABELS, registers: [registry] });
const serverHandling = new Histogram({
  name: 'grpc_server_handling_seconds',
  help: 'Time from the start of a served RPC to its end, seconds',
  labelNames: LABELS,
  buckets: GRPC_HANDLING_BUCKETS,
  registers: [registry],
});
const clientStarted = new Counter({ name: 'grpc_client_started_total', help: 'RPCs started by clients of this process', labelNames: LABELS, registers: [registry] });
const clientHandled = new Counter({ name: 'grpc_client_handled_total', help: 'RPCs completed by clients of this process, by status code', labelNames: CODE_LABELS, registers: [registry] });
const clientHandling = new Histogram({
  name: 'grpc_client_handling_seconds',
  help: 'Time from the start of a client RPC to its end, seconds',
  labelNames: LABELS,
  buckets: GRPC_HANDLING_BUCKETS,
  registers: [registry],
});

/** grpcLabels are the method labels of a call path "/pkg.Service/Method" and its streaming kind. */
export function grpcLabels(method: Pick<MethodDescriptor, 'path' | 'requestStream' | 'responseStream'>): { grpc_type: string; grpc_service: string; grpc_method: string } {
  const [, service = '', name = ''] = method.path.split('/');
  const grpc_type = method.requestStream ? (method.responseStream ? 'bidi_stream' : 'client_stream') : method.responseStream ? 'server_stream' : 'unary';
  return { grpc_type, grpc_service: service, grpc_method: name };
}

/** startServerCall counts a served call as started; the returned function ends it with its status code. */
export function startServerCall(method: Pick<MethodDescriptor, 'path' | 'requestStream' | 'responseStream'>): (code: Status) => void {
  const labels = grpcLabels(method);
  serverStarted.inc(labels);
  const end = serverHandling.startTimer(labels);
  return (code) => {
    end();
    serverHandled.inc({ ...labels, grpc_code: Status[code] ?? String(code) });
  };
}

/** clientMetricsMiddleware counts and times every client call attempt (grpc_client_*); UNKNOWN for a non-gRPC error, CANCELLED for an abort. */
export const clientMetricsMiddleware: ClientMiddleware = async function* clientMetrics(call, options) {
  const labels = grpcLabels(call.method);
  clientStarted.inc(labels);
  const end = clientHandling.startTimer(labels);
  let code: Status = Status.OK;
  try {
    return yield* call.next(call.request, options);
  } catch (err) {
    code = err instanceof ClientError ? err.code : (err as { name?: string })?.name === 'AbortError' ? Status.CANCELLED : Status.UNKNOWN;
    throw err;
  } finally {
    end();
    clientHandled.inc({ ...labels, grpc_code: Status[code] ?? String(code) });
  }
};
