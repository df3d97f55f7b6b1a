/** @sandnode/shared: the common package of every sandnode component. */
export * from './errors';
export * from './logger';
export * from './config';
export * from './version';
export * from './server';
export * from './client';
export * from './metrics';
export * from './proc';
export * from './durable';
export * from './freeze-window';
export * from './paths';
export * from './ids';
export * from './daemon';
export * from './keyed-mutex';
export * from './epoch-fence';
export * from './grpc-host';
export * from './server-api';
