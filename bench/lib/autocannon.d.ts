// The part of autocannon 9's programmatic API the benches use (the package ships no types).
declare module 'autocannon' {
  namespace autocannon {
    interface Options {
      url: string;
      method?: string;
      headers?: Record<string, string>;
      body?: string;
      connections?: number;
      pipelining?: number;
      /** seconds */
      duration?: number;
      amount?: number;
      /** seconds */
      timeout?: number;
      workers?: number;
    }
    interface Histogram {
      average: number;
      mean: number;
      stddev: number;
      min: number;
      max: number;
      total: number;
      p50: number;
      p90: number;
      p99: number;
      p99_9: number;
    }
    interface Result {
      url: string;
      connections: number;
      /** seconds */
      duration: number;
      errors: number;
      timeouts: number;
      non2xx: number;
      statusCodeStats: Record<string, { count: number }>;
      /** ms */
      latency: Histogram;
      /** per-second samples; `total` is every completed request */
      requests: Histogram & { sent: number };
      throughput: Histogram;
    }
    interface Instance {
      /** ends the run early; the callback still receives the result */
      stop(): void;
      /** every answer, whatever its status; `responseTime` in ms (fractional) */
      on(event: 'response', listener: (client: unknown, statusCode: number, resBytes: number, responseTime: number) => void): this;
    }
  }
  function autocannon(options: autocannon.Options): Promise<autocannon.Result>;
  function autocannon(options: autocannon.Options, done: (err: Error | null, result: autocannon.Result) => void): autocannon.Instance;
  export = autocannon;
}
