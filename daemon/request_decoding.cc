// RequestDecodingInterceptorFactory: INTERNAL-without-details before any handler ran becomes
// INVALID_ARGUMENT with a reason.
#include "daemon/request_decoding.h"

#include <string>

namespace kiln::daemon {
namespace {

class RequestDecodingInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit RequestDecodingInterceptor(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      decoded_ = methods->GetRecvMessage() != nullptr;
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status status = methods->GetSendStatus();
      if (!decoded_ && status.error_code() == grpc::StatusCode::INTERNAL &&
          status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            "request bytes do not decode as the message " + method_ + " takes (kiln.v1)"));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool decoded_ = false;
};

}  // namespace

grpc::experimental::Interceptor* RequestDecodingInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new RequestDecodingInterceptor(info->method() != nullptr ? info->method() : "");
}

}  // namespace kiln::daemon
