# `cmake --install <build> [--prefix P]` installs what a user builds against:
#   P/lib/librefit.a                      the library (static)
#   P/include/refit/*.h                   the public headers
#   P/bin/refit                           the command
#   P/lib/cmake/refit/refitConfig.cmake   find_package(refit) -> refit::refit
#   P/lib/pkgconfig/refit.pc              pkg-config --cflags --libs refit
# tests/install_test.sh builds a small consumer program against such a tree.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS refit_core EXPORT refitTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS refit RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/refit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT refitTargets NAMESPACE refit:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/refit)

set(REFIT_CONFIG_HAVE_CUDA ${REFIT_HAVE_CUDA})
set(REFIT_CONFIG_HAVE_UCX ${REFIT_HAVE_UCX})
configure_package_config_file(cmake/refitConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/refitConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/refit)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/refitConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/refitConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/refitConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/refit)

# pkg-config: the static library needs its private dependencies on the link line.
set(REFIT_PC_LIBS "-lrefit ${XXHASH_LIBRARY} ${OPENSSL_CRYPTO_LIBRARY} -lrt -pthread")
set(REFIT_PC_REQUIRES "")
if(REFIT_HAVE_UCX)
  set(REFIT_PC_REQUIRES "ucx")
endif()
if(REFIT_HAVE_CUDA)
  string(APPEND REFIT_PC_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
if(REFIT_HAVE_NCCL)
  string(APPEND REFIT_PC_LIBS " ${NCCL_LIBRARY}")
endif()
configure_file(cmake/refit.pc.in ${CMAKE_CURRENT_BINARY_DIR}/refit.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/refit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
