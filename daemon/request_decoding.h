// Requests whose bytes do not decode never reach a handler: gRPC answers INTERNAL with empty
// details. This server interceptor makes that answer what the contract says (service.proto,
// README): INVALID_ARGUMENT, naming the message that did not decode. A handler's own statuses
// pass through untouched (ToGrpc never sends INTERNAL without details).
#pragma once

#include <grpcpp/support/server_interceptor.h>

namespace kiln::daemon {

class RequestDecodingInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace kiln::daemon
